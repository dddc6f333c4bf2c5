"""The ComfyUI-native nodes in real ComfyUI, 0.3.64 and 0.30.0 (``shared/peers/real-comfyui.sh``), on the tiny files
``lorabind models build-tiny --comfyui`` writes: the shipped Wan2.2 lightx2v workflow's tiny twin runs through core
loaders, our pair node, core ``KSamplerAdvanced`` x2, core decode and save; the same prompt with 20 steps or cfg 5
fails in the first sampler before any step, naming the LoRA file and the field; a swapped pair is refused in the
node's words; the Qwen-Image Lightning example's twin runs on core loaders and ``KSampler``. For every LoRA fixture
``build-tiny`` makes (Edit-2511's from 0.30.0, the first ComfyUI with that model), the weights ComfyUI's patcher
writes with ``LoraBindLoRA`` equal our own fuse within bf16 rounding, also when a patch is applied the streaming
way, every file tensor is accounted for, and the keys ComfyUI's own ``LoraLoaderModelOnly`` leaves unapplied are
counted (``comfy_patcher_cases.py``, the table in ``docs/comfyui/native-mode.md``).

One ComfyUI start per version serves every prompt: ``comfy_native_client.py`` queues them through ``--exec``.
"""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from comfy_patcher_cases import (
    CASES,
    PEFT_SCALING_CASE,
    our_fused_weights,
    probe_prompt,
    rounding_excess,
    write_edit_2511_file,
    write_peft_scaling_folder,
)
from real_comfyui import build_tiny_for_comfyui, classes_from_object_info, run_native_prompts, version_tuple

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY_WORKFLOW = REPO / "tests" / "data" / "comfy_wan22_lightx2v_4step.tiny.api.json"
SHIPPED_WORKFLOW = REPO / "workflows" / "api" / "comfy_wan22_lightx2v_4step.api.json"
QWEN_TINY_WORKFLOW = REPO / "tests" / "data" / "comfy_qwen_image_lightning.tiny.api.json"
HIGH_LORA = "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"
STAND_INS = {"LoraBindTestWanConditioning", "LoraBindTestQwenImageConditioning"}
TEXT_ENCODING = {"CLIPLoader", "CLIPTextEncode"}  # what the stand-in replaces in the shipped workflow
TINY_SIZES = {"width", "height"}  # the twins sample 32x32 (the shipped Qwen-Image example: 1328x1328)


def _variant(**changes) -> dict:
    prompt = json.loads(TINY_WORKFLOW.read_text())
    for node_id, inputs in changes.items():
        prompt[node_id]["inputs"].update(inputs)
    return prompt


def _custom_sampler_prompt(cfg: float) -> dict:
    """One expert with a single LoraBindLoRA, sampled by SamplerCustomAdvanced on LoraBindContractSigmas."""
    tiny = json.loads(TINY_WORKFLOW.read_text())
    prompt = {node_id: tiny[node_id] for node_id in ("1", "3", "5", "6", "10")}
    high = tiny["7"]["inputs"]["lora_high"]
    nodes = {
        "20": ("LoraBindLoRA", {"model": ["1", 0], "lora_name": high, "strength": 1.0, "lenient": False,
                                "enforce_contract": True}),
        "21": ("ModelSamplingSD3", {"model": ["20", 0], "shift": 5.0}),
        "22": ("LoraBindContractSigmas", {"model": ["21", 0]}),
        "23": ("RandomNoise", {"noise_seed": 7}),
        "24": ("KSamplerSelect", {"sampler_name": "euler"}),
        "25": ("CFGGuider", {"model": ["21", 0], "positive": ["5", 0], "negative": ["6", 0], "cfg": cfg}),
        "26": ("SamplerCustomAdvanced", {"noise": ["23", 0], "guider": ["25", 0], "sampler": ["24", 0],
                                         "sigmas": ["22", 0], "latent_image": ["10", 0]}),
        "27": ("VAEDecode", {"samples": ["26", 0], "vae": ["3", 0]}),
        "28": ("SaveAnimatedWEBP", {"images": ["27", 0], "filename_prefix": f"custom_sigmas_cfg{cfg:g}", "fps": 16.0,
                                    "lossless": False, "quality": 80, "method": "default"}),
    }
    prompt.update({node_id: {"class_type": kind, "inputs": inputs} for node_id, (kind, inputs) in nodes.items()})
    return prompt


@pytest.fixture(scope="module")
def native_models(tmp_path_factory) -> Path:
    """``build-tiny --comfyui``'s files (and the PEFT scaling folder), once for every ComfyUI version."""
    models = build_tiny_for_comfyui(tmp_path_factory.mktemp("comfy_native_models"))
    write_peft_scaling_folder(models)
    write_edit_2511_file(models)
    return models


@pytest.fixture(scope="module")
def comfy_results(tmp_path_factory, native_models, comfy_version):
    work, models = tmp_path_factory.mktemp("comfy_native"), native_models
    pair = json.loads(TINY_WORKFLOW.read_text())["7"]["inputs"]
    prompts = {
        "contract": _variant(),
        "steps20": _variant(**{"11": {"steps": 20, "noise_seed": 1}, "12": {"steps": 20, "noise_seed": 1}}),
        "cfg5": _variant(**{"11": {"cfg": 5.0, "noise_seed": 2}, "12": {"cfg": 5.0, "noise_seed": 2}}),
        "swapped": _variant(**{"7": {"lora_high": pair["lora_low"], "lora_low": pair["lora_high"]}}),
        "enforce_off": _variant(**{"7": {"enforce_contract": False}, "11": {"cfg": 5.0, "noise_seed": 3},
                                   "12": {"cfg": 5.0, "noise_seed": 3}}),
        "qwen_example": json.loads(QWEN_TINY_WORKFLOW.read_text()),
        "custom_sigmas": _custom_sampler_prompt(1.0),
        "custom_cfg5": _custom_sampler_prompt(5.0),
        **{f"probe_{label}": probe_prompt(models, label, case) for label, case in CASES.items()
           if _runs_in(case, comfy_version)},
        "probe_peft_scaling": probe_prompt(models, "peft_scaling", PEFT_SCALING_CASE, node="LoraBindPEFTAdapter"),
        "peft_on_a_file": probe_prompt(models, "peft_on_a_file", CASES["wan21_t2v"], node="LoraBindPEFTAdapter"),
        "qwen_on_wan": _another_familys_lora(models),
    }
    results, output, log = run_native_prompts(
        comfy_version, work, models, prompts, "LoraBindLoRA,LoraBindLoRAPair,LoraBindPEFTAdapter,LoraBindContractSigmas")
    return results, output, models, log, comfy_version


def _another_familys_lora(models: Path) -> dict:
    """The Qwen-Image Lightning fixture into LoraBindLoRA on ComfyUI's Wan2.1 model."""
    prompt = probe_prompt(models, "qwen_on_wan", CASES["wan21_t2v"])
    prompt["1"]["inputs"]["lora_name"] = CASES["qwen_image_lightning"].lora
    return prompt


def _runs_in(case, version: str) -> bool:
    return not case.since or version_tuple(version) >= version_tuple(case.since)


def test_the_tiny_workflow_runs_in_real_comfyui_and_writes_its_output(comfy_results):
    results, output = comfy_results[:2]
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
    message = error["exception_message"]
    assert error["node_id"] == "7" and "the pair is swapped" in message and HIGH_LORA in message
    # in the node's words (its model_high / model_low inputs), not diffusers' component names
    assert f"{HIGH_LORA} says high noise but goes into model_low (LoraBindLoRAPair lora_low)" in message
    assert "put high-noise files into model_high and low-noise files into model_low" in message
    assert "transformer" not in message


def test_a_qwen_image_lora_on_a_wan_model_is_refused_as_another_familys(comfy_results):
    """Qwen-Image's text-stream projections share diffusers' ``add_k_proj`` / ``add_v_proj`` names with Wan2.1 I2V's
    image branch; on a Wan model they are another family's keys like the rest of the file, not an image branch."""
    run = comfy_results[0]["qwen_on_wan"]
    assert run["status"] == "error" and run["error"]["node_id"] == "1"
    message = run["error"]["exception_message"]
    assert os.path.basename(CASES["qwen_image_lightning"].lora) in message and "key(s) match nothing" in message
    assert ("They are another model family's keys: the file's module names look like a qwen_image LoRA, not one for "
            "this wan2.1 model.") in message
    assert "image branch" not in message and "I2V" not in message


def test_enforce_contract_off_samples_anyway_and_records_the_override(comfy_results):
    run, log = comfy_results[0]["enforce_off"], comfy_results[3]
    assert run["status"] == "success", run["error"]
    assert "contract NOT enforced (enforce_contract off)" in " ".join(run["outputs"]["7"]["text"])
    (override,) = {line for line in log.splitlines() if line.startswith("[lorabind]") and HIGH_LORA in line}
    assert "not enforced: enforce_contract off" in override and "cfg must be 1" in override


def test_a_single_lora_node_and_contract_sigmas_drive_sampler_custom_advanced(comfy_results):
    run = comfy_results[0]["custom_sigmas"]
    assert run["status"] == "success", run["error"]
    assert "0 unmatched" in " ".join(run["outputs"]["20"]["text"])
    assert "sigmas 1.0000, 0.9375, 0.8333, 0.6250, 0.0000" in run["outputs"]["22"]["text"][0]
    assert any("images" in output for output in run["outputs"].values())
    refused = comfy_results[0]["custom_cfg5"]
    assert refused["status"] == "error" and refused["error"]["node_id"] == "26"
    assert HIGH_LORA in refused["error"]["exception_message"]
    assert "cfg must be 1" in refused["error"]["exception_message"]


def test_the_qwen_image_example_twin_runs_on_comfyuis_own_loaders_and_sampler(comfy_results):
    """The shipped Qwen-Image Lightning example (UNETLoader, LoraBindLoRA, ModelSamplingAuraFlow, KSampler) on a
    Qwen-Image ComfyUI detects itself: every LoRA key applied, the contract enforced, the image saved."""
    run, output = comfy_results[0]["qwen_example"], comfy_results[1]
    assert run["status"] == "success", run["error"]
    text = " ".join(run["outputs"]["4"]["text"])
    assert "0 unmatched" in text, text
    assert "contract enforced: Qwen-Image-Lightning-4steps-V1.0.safetensors: distill steps=4 shift=3 cfg=1" in text
    (image,) = run["outputs"]["11"]["images"]
    assert image["filename"].startswith("comfy_qwen_image_lightning_")
    assert (output / image["subfolder"] / image["filename"]).stat().st_size > 0


@pytest.mark.parametrize("tiny_path", [TINY_WORKFLOW, QWEN_TINY_WORKFLOW], ids=lambda path: path.name.split(".")[0])
def test_the_shipped_workflow_differs_from_the_tiny_one_only_in_file_names_and_the_stand_in(tiny_path):
    shipped = json.loads((SHIPPED_WORKFLOW.parent / tiny_path.name.replace(".tiny", "")).read_text())
    tiny = json.loads(tiny_path.read_text())
    stand_ins = {node_id for node_id, node in tiny.items() if node["class_type"] in STAND_INS}
    encoders = {node_id for node_id, node in shipped.items() if node["class_type"] in TEXT_ENCODING}
    assert stand_ins and stand_ins <= encoders
    assert set(shipped) - encoders == set(tiny) - stand_ins
    for node_id in set(tiny) - stand_ins:
        ours, theirs = shipped[node_id], tiny[node_id]
        assert ours["class_type"] == theirs["class_type"], node_id
        for name, value in theirs["inputs"].items():
            if value != ours["inputs"][name] and name not in TINY_SIZES:
                assert _is_file_name(value) and _is_file_name(ours["inputs"][name]), (node_id, name)
                assert os.path.basename(value) == os.path.basename(ours["inputs"][name]) or "tiny" in value
    for node_id in stand_ins:  # the stand-in takes the text the shipped encoder gets
        assert tiny[node_id]["inputs"]["text"] == shipped[node_id]["inputs"]["text"]


@pytest.mark.parametrize("example", ["comfy_wan22_lightx2v_4step", "comfy_qwen_image_lightning"])
def test_the_shipped_ui_form_converts_to_the_shipped_api_form_with_real_comfyui_definitions(comfy_results, example):
    """The UI workflow a user opens gives, through our frontend-compatible conversion with the node definitions of
    the ComfyUI that ran the tiny twin, exactly the shipped API form (every core-node value set, none left to a
    default)."""
    from comfy_native_client import OBJECT_INFO
    from lorabind.runtime.workflow_format import to_api_prompt

    classes = classes_from_object_info(comfy_results[0][OBJECT_INFO])
    ui = json.loads((REPO / "workflows" / f"{example}.json").read_text())
    converted, kind = to_api_prompt(ui, classes)
    without_titles = {node_id: {"class_type": node["class_type"], "inputs": node["inputs"]}  # _meta: UI titles
                      for node_id, node in converted.items()}
    shipped = json.loads((SHIPPED_WORKFLOW.parent / f"{example}.api.json").read_text())
    assert kind == "ui" and without_titles == shipped


def _is_file_name(value) -> bool:
    return isinstance(value, str) and value.endswith(".safetensors")


# Keys of each fixture that ComfyUI's own LoraLoaderModelOnly leaves unapplied (its "lora key not loaded" lines),
# measured in ComfyUI 0.3.64 and 0.30.0 alike: lightx2v files lose every block's diff_m (the modulation diff; 40 keys in the real
# 40-block files), the Wan2.2 I2V pair also the 24 keys of the Wan2.1 image branch (which no Wan2.2 expert has:
# expected-unmatched for us too), a PEFT folder (its adapter_model.safetensors) all of them. The table in
# docs/comfyui/native-mode.md: {fixture: (keys ComfyUI leaves unapplied, of which ours applies)}.
COMFY_UNAPPLIED = {"wan22_t2v_high": (2, 2), "wan22_t2v_low": (2, 2), "wan21_t2v": (2, 2),
                   "wan21_peft_folder": (32, 32), "wan22_i2v_high": (26, 2), "wan22_i2v_low": (26, 2),
                   "wan21_i2v": (2, 2), "qwen_image_lightning": (0, 0), "qwen_image_edit_2511": (0, 0)}


def _probe(comfy_results, label) -> dict:
    case = CASES.get(label)
    if case is not None and not _runs_in(case, comfy_results[4]):
        pytest.skip(case.why_since)
    run = comfy_results[0][f"probe_{label}"]
    assert run["status"] == "success", run["error"]
    return run["outputs"]["1"]["probe"][0]


def _file_tensor_count(path: Path) -> int:
    weights = path / "adapter_model.safetensors" if path.is_dir() else path
    with safe_open(str(weights), "pt") as handle:
        return len(list(handle.keys()))


def test_every_lora_fixture_build_tiny_makes_has_a_patcher_case(comfy_results):
    fixture_root = comfy_results[2] / "loras" / "lorabind-tiny"
    # MiniMax-H3 is not ComfyUI's model in 0.3.64 (its own tests cover ComfyUI's MiniMax-H3)
    made = {f"lorabind-tiny/{entry.name}" for entry in fixture_root.iterdir()
            if entry.name != "comfyui" and not entry.name.startswith("minimax_h3")}
    assert made == {case.lora for case in CASES.values()}
    assert set(COMFY_UNAPPLIED) == set(CASES)


def _assert_patcher_wrote_our_fuse(comfy_results, label, case):
    probe, models = _probe(comfy_results, label), comfy_results[2]
    assert probe["dtype"] == "torch.bfloat16"
    theirs = _weights(load_file(str(comfy_results[1] / f"patched_{label}.safetensors")))
    ours = our_fused_weights(models, case)
    original = _weights({key.removeprefix("model.diffusion_model."): value for key, value in load_file(
        str(models / "diffusion_models" / "lorabind-tiny" / f"{case.denoiser}_bf16.safetensors")).items()})
    assert set(theirs) == set(ours) == set(original)
    excess = {key: rounding_excess(theirs[key], ours[key], original[key]) for key in theirs}
    assert max(excess.values()) <= 0, {key: value for key, value in excess.items() if value > 0}
    changed = [key for key in ours if not ours[key].equal(original[key].float())]
    assert len(changed) == probe["ours_patched"] > 0  # every patch we added reached the weights
    streamed = probe["streamed"]  # streamed in the model's dtype (low VRAM; 0.30.0's dynamic VRAM): the same value
    assert streamed["dtype"] == "torch.bfloat16", streamed
    assert streamed["max_diff"] <= 2 * torch.finfo(torch.bfloat16).eps * streamed["max_abs"], streamed
    return probe


def _weights(tensors: dict) -> dict:
    """Without empty tensors: the 2511 marker (and ComfyUI's buffer for it) carries no weight."""
    return {key: value for key, value in tensors.items() if value.numel()}


@pytest.mark.parametrize("label", sorted(CASES))
def test_comfyui_patcher_writes_our_fused_weights_for_every_fixture(comfy_results, label):
    probe = _assert_patcher_wrote_our_fuse(comfy_results, label, CASES[label])
    if CASES[label] is CASES["qwen_image_edit_2511"]:  # ComfyUI built its Edit-2511 model from the marker
        assert probe["ref_method"] == "index_timestep_zero"


def test_the_peft_adapter_node_applies_every_peft_scale_rule_as_our_fuse_does(comfy_results):
    """rsLoRA, a rank_pattern and an alpha_pattern (``write_peft_scaling_folder``): ComfyUI's patcher writes what
    our fuse of the same folder writes, and the node says which rule it used."""
    probe = _assert_patcher_wrote_our_fuse(comfy_results, "peft_scaling", PEFT_SCALING_CASE)
    assert probe["accounting"]["counts"]["unmatched"] == 0
    (scaling,) = [line for line in probe["text"] if line.startswith("PEFT scale")]
    assert "alpha/sqrt(r) (rsLoRA)" in scaling and "1 rank_pattern entry, 1 alpha_pattern entry" in scaling
    assert "module scales 1.5 to 11.3137" in scaling


def test_the_peft_adapter_node_refuses_a_single_file_naming_it(comfy_results):
    run = comfy_results[0]["peft_on_a_file"]
    assert run["status"] == "error"
    message = run["error"]["exception_message"]
    assert CASES["wan21_t2v"].lora in message and "not a PEFT adapter folder" in message


@pytest.mark.parametrize("label", sorted(CASES))
def test_every_file_tensor_is_accounted_for_and_comfyui_own_loader_misses_the_counted_keys(comfy_results, label):
    probe, case = _probe(comfy_results, label), CASES[label]
    counts = probe["accounting"]["counts"]
    assert counts["unmatched"] == 0
    assert counts["applied"] + counts["expected_unmatched"] == _file_tensor_count(
        comfy_results[2] / "loras" / case.lora)
    unapplied, ours_applies = COMFY_UNAPPLIED[label]
    assert len(probe["comfy_not_loaded"]) == unapplied, probe["comfy_not_loaded"]
    assert unapplied - counts["expected_unmatched"] == ours_applies
