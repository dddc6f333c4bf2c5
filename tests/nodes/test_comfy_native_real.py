"""The ComfyUI-native nodes in real ComfyUI 0.3.64 (``shared/peers/real-comfyui.sh``), on the tiny files
``lorabind models build-tiny --comfyui`` writes: the shipped Wan2.2 lightx2v workflow's tiny twin runs through core
loaders, our pair node, core ``KSamplerAdvanced`` x2, core decode and save; the same prompt with 20 steps or cfg 5
fails in the first sampler before any step, naming the LoRA file and the field; a swapped pair is refused by name.

One ComfyUI start serves every prompt: ``comfy_native_client.py`` queues them through ``--exec``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY_WORKFLOW = REPO / "tests" / "data" / "comfy_wan22_lightx2v_4step.tiny.api.json"
SHIPPED_WORKFLOW = REPO / "workflows" / "comfy_wan22_lightx2v_4step.api.json"
TEST_PACK = REPO / "tests" / "data" / "comfy_test_pack"
CLIENT = REPO / "tests" / "helpers" / "comfy_native_client.py"
HIGH_LORA = "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"
STAND_IN = "LoraBindTestWanConditioning"
TEXT_ENCODING = {"CLIPLoader", "CLIPTextEncode"}  # what the stand-in replaces in the shipped workflow


def _harness() -> Path:
    for folder in REPO.parents:
        script = folder / "shared" / "peers" / "real-comfyui.sh"
        if script.is_file():
            return script
    pytest.skip(f"no real ComfyUI harness (shared/peers/real-comfyui.sh above {REPO})")


def _variant(**changes) -> dict:
    prompt = json.loads(TINY_WORKFLOW.read_text())
    for node_id, inputs in changes.items():
        prompt[node_id]["inputs"].update(inputs)
    return prompt


@pytest.fixture(scope="module")
def comfy_results(tmp_path_factory):
    work = tmp_path_factory.mktemp("comfy_native")
    models = work / "models"
    built = subprocess.run([sys.executable, "-m", "lorabind.runtime.cli", "models", "build-tiny", "--models",
                            str(models), "--only", "tiny-wan22-t2v", "--comfyui"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    pair = json.loads(TINY_WORKFLOW.read_text())["7"]["inputs"]
    prompts = {
        "contract": _variant(),
        "steps20": _variant(**{"11": {"steps": 20, "noise_seed": 1}, "12": {"steps": 20, "noise_seed": 1}}),
        "cfg5": _variant(**{"11": {"cfg": 5.0, "noise_seed": 2}, "12": {"cfg": 5.0, "noise_seed": 2}}),
        "swapped": _variant(**{"7": {"lora_high": pair["lora_low"], "lora_low": pair["lora_high"]}}),
    }
    (work / "prompts.json").write_text(json.dumps(prompts))
    results = work / "results.json"
    command = [str(_harness()), "--name", "lorabind", "--models-dir", str(models), "--extra-pack", str(TEST_PACK),
               "--nodes", "LoraBindLoRA,LoraBindLoRAPair,LoraBindContractSigmas",
               "--exec", f"'{sys.executable}' '{CLIENT}' \"$COMFY_URL\" '{work / 'prompts.json'}' '{results}'; "
                         f"cp -r \"$COMFY_BASE/output\" '{work / 'output'}'", str(REPO)]
    run = subprocess.run(["bash", *command], capture_output=True, text=True, timeout=1800)
    assert results.is_file(), run.stdout[-4000:] + run.stderr[-2000:]
    assert "SUMMARY: PASS" in run.stdout, run.stdout[-4000:]
    return json.loads(results.read_text()), work / "output"


def test_the_tiny_workflow_runs_in_real_comfyui_and_writes_its_output(comfy_results):
    results, output = comfy_results
    assert results["contract"]["status"] == "success", results["contract"]["error"]
    (saved,) = [out for out in results["contract"]["outputs"].values() if "images" in out]
    (image,) = saved["images"]
    assert image["filename"].startswith("comfy_wan22_lightx2v_4step_") and image["filename"].endswith(".webp")
    assert (output / image["subfolder"] / image["filename"]).stat().st_size > 0
    pair_text = " ".join(results["contract"]["outputs"]["7"]["text"])
    assert "0 unmatched" in pair_text and "switch at step 2 of 4" in pair_text


@pytest.mark.parametrize("label, field", [("steps20", "steps/sigmas"), ("cfg5", "cfg must be 1")])
def test_a_prompt_off_the_contract_fails_in_the_first_sampler_naming_file_and_field(comfy_results, label, field):
    error = comfy_results[0][label]["error"]
    assert comfy_results[0][label]["status"] == "error"
    assert error["node_id"] == "11" and error["exception_type"] == "ContractError"
    assert HIGH_LORA in error["exception_message"] and field in error["exception_message"]
    assert "12" not in error["executed"]  # the low-noise sampler never ran


def test_a_swapped_pair_is_refused_by_name_in_real_comfyui(comfy_results):
    error = comfy_results[0]["swapped"]["error"]
    assert error["node_id"] == "7" and "the pair is swapped" in error["exception_message"]
    assert HIGH_LORA in error["exception_message"]


def test_the_shipped_workflow_differs_from_the_tiny_one_only_in_file_names_and_the_stand_in():
    shipped, tiny = json.loads(SHIPPED_WORKFLOW.read_text()), json.loads(TINY_WORKFLOW.read_text())
    stand_ins = {node_id for node_id, node in tiny.items() if node["class_type"] == STAND_IN}
    encoders = {node_id for node_id, node in shipped.items() if node["class_type"] in TEXT_ENCODING}
    assert stand_ins and stand_ins <= encoders
    assert set(shipped) - encoders == set(tiny) - stand_ins
    for node_id in set(tiny) - stand_ins:
        ours, theirs = shipped[node_id], tiny[node_id]
        assert ours["class_type"] == theirs["class_type"], node_id
        for name, value in theirs["inputs"].items():
            if value != ours["inputs"][name]:
                assert _is_file_name(value) and _is_file_name(ours["inputs"][name]), (node_id, name)
                assert os.path.basename(value) == os.path.basename(ours["inputs"][name]) or "tiny" in value
    for node_id in stand_ins:  # the stand-in takes the text the shipped encoder gets
        assert tiny[node_id]["inputs"]["text"] == shipped[node_id]["inputs"]["text"]


def _is_file_name(value) -> bool:
    return isinstance(value, str) and value.endswith(".safetensors")
