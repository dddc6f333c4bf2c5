"""The pack inside real ComfyUI, each version of ``real_comfyui.COMFY_VERSIONS``: its memory controls free our
models, nothing the browser sees holds a local path, the LoRA list is the headless one, and model loading is not
reported as steps.

One ComfyUI serves the module; each test talks to its HTTP and WebSocket API like the browser does.
"""

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageSequence

import lorabind
from lorabind.tiny_models.lora_fixtures import PEFT_FOLDER
from real_comfyui import RealComfyUI, strings_in

pytestmark = pytest.mark.slow

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
LORA_NODES = ("LoadPEFTAdapter", "FuseDistillLoRA", "MiniMaxTurboSchedule")


def _workflow(name: str, seed: int) -> dict:
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    for node in prompt.values():
        if "seed" in node["inputs"]:
            node["inputs"]["seed"] = seed  # a seed of its own: no test gets another test's cached outputs
    return prompt


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, tiny_models_root):
    """The session's tiny models and fixture LoRAs, plus ``broken-wan21``: a Wan2.1 folder whose transformer
    weights are not a safetensors file, so loading it fails inside the library."""
    root = tmp_path_factory.mktemp("comfy_models")
    shutil.copytree(tiny_models_root, root, dirs_exist_ok=True, symlinks=True)
    broken = shutil.copytree(root / "diffusers" / "tiny-wan21-t2v", root / "diffusers" / "broken-wan21")
    (broken / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    return root


@pytest.fixture(scope="module")
def comfy(tmp_path_factory, models_dir, comfy_version):
    with RealComfyUI(tmp_path_factory.mktemp("comfy_run"), models_dir, version=comfy_version) as running:
        status, info = running.get("/object_info/LoraBindSampler")
        assert status == 200 and "LoraBindSampler" in info, running.log_tail()
        yield running


def _saved_frames(comfy, run) -> list[np.ndarray]:
    (images,) = [out["images"] for out in run.history["outputs"].values() if "images" in out]
    (entry,) = images
    path = comfy.base / entry["type"] / entry["subfolder"] / entry["filename"]
    with Image.open(path) as image:
        return [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]


def _wait_for_models(comfy, wanted, timeout=30.0) -> dict:
    """The probe's answer once it lists ``wanted`` (ComfyUI frees memory in its worker, after the request)."""
    deadline = time.monotonic() + timeout
    while True:
        status, probed = comfy.get("/lorabind_probe/models")
        assert status == 200
        if probed["loaded"] == wanted or time.monotonic() > deadline:
            return probed
        time.sleep(0.25)


def test_free_model_and_node_cache_drops_our_models_and_the_next_run_reloads_identically(comfy):
    prompt = _workflow("wan21_distill", seed=101)
    first = comfy.run(prompt)
    assert first.error is None and first.history["status"]["status_str"] == "success", first.error
    probed = _wait_for_models(comfy, ["tiny-wan21-t2v"])
    assert probed["loaded"] == ["tiny-wan21-t2v"]
    loads_before = probed["loads"]["tiny-wan21-t2v"]

    # the "Free model and node cache" button
    assert comfy.post("/free", {"unload_models": True, "free_memory": True})[0] == 200
    assert _wait_for_models(comfy, [])["loaded"] == []

    second = comfy.run(prompt)
    assert second.error is None, second.error
    probed = _wait_for_models(comfy, ["tiny-wan21-t2v"])
    assert probed["loads"]["tiny-wan21-t2v"] == loads_before + 1  # read from disk again, not kept somewhere
    before, after = _saved_frames(comfy, first), _saved_frames(comfy, second)
    assert len(before) == len(after) == 5
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    # loading placed each component again: labelled work (progress_state), never `progress`, which clients count
    # as sampling steps; the steps are the sampler's 4 (ComfyUI 0.30's ProgressBar always sends the first and
    # the last update and throttles those between by time, so there a fast step may not be sent)
    steps = [(p["node"], p["value"], p["max"]) for p in second.of_type("progress")]
    assert steps[0] == ("6", 1, 4) and steps[-1] == ("6", 4, 4) and set(steps) <= {("6", n, 4) for n in range(1, 5)}
    assert [value for _, value, _ in steps] == sorted(set(value for _, value, _ in steps))
    assert any("1" in state["nodes"] for state in second.of_type("progress_state"))


def _local_roots(comfy, models_dir) -> set[str]:
    roots = {str(comfy.base), str(models_dir), str(Path(lorabind.__file__).parent), os.path.expanduser("~"),
             tempfile.gettempdir()}
    return roots | {os.path.realpath(root) for root in roots}


def test_a_failed_model_load_and_a_lora_bind_show_no_absolute_path(comfy, models_dir):
    roots = _local_roots(comfy, models_dir)
    bound = comfy.run(_workflow("wan21_distill", seed=202))
    assert bound.error is None, bound.error
    executed = bound.of_type("executed")
    assert any("lorabind_schedule" in message["output"] for message in executed)  # the bind report is in there
    leaked = [s for message in executed for s in strings_in(message) if any(root in s for root in roots)]
    assert leaked == []

    broken = _workflow("wan21_distill", seed=203)
    broken["1"]["inputs"]["model_name"] = "broken-wan21"
    failed = comfy.run(broken)
    error = failed.error
    assert error is not None and error["node_id"] == "1", failed.messages
    message = error["exception_message"]
    assert message.startswith("broken-wan21: cannot load the wan2.1 pipeline: ")
    assert "broken-wan21/transformer/diffusion_pytorch_model.safetensors" in message
    assert [root for root in roots if root in message] == []
    history_messages = [m for _, m in failed.history["status"]["messages"]]
    assert [root for m in history_messages for s in strings_in(m.get("exception_message", "")) for root in roots
            if root in s] == []


def test_lora_choices_are_the_same_list_inside_comfyui_and_headless(comfy, models_dir, registry_at):
    from lorabind.nodes.adapter_nodes import lora_choices

    registry_at(models_dir)
    headless = lora_choices()
    assert PEFT_FOLDER in headless and f"{PEFT_FOLDER}/adapter_model.safetensors" not in headless
    for node in LORA_NODES:
        status, info = comfy.get(f"/object_info/{node}")
        assert status == 200
        assert info[node]["input"]["required"]["lora_name"][0] == headless, node


def test_a_peft_folders_inner_file_is_refused_as_headless(comfy):
    """The list decides validation: the inner weight file of a PEFT folder is no choice, in ComfyUI as headless."""
    prompt = _workflow("peft_two_branches", seed=404)
    loaders = [node_id for node_id, node in prompt.items() if node["class_type"] == "LoadPEFTAdapter"]
    assert loaders and all(prompt[node_id]["inputs"]["lora_name"] == PEFT_FOLDER for node_id in loaders)
    prompt[loaders[0]]["inputs"]["lora_name"] = f"{PEFT_FOLDER}/adapter_model.safetensors"
    refused = comfy.run(prompt)  # ComfyUI still runs the branches that validate; this one it refuses
    errors = refused.body["node_errors"][loaders[0]]["errors"]
    assert [(e["type"], e["extra_info"]["input_name"]) for e in errors] == [("value_not_in_list", "lora_name")]


def test_the_three_stage_example_runs_in_comfyui_and_refuses_the_middle_stage_past_the_boundary(comfy):
    prompt = _workflow("wan22_lightning_three_stage", seed=505)
    run = comfy.run(prompt)
    assert run.error is None, run.error
    texts = {m["node"]: m["output"]["text"] for m in run.of_type("executed") if "text" in (m["output"] or {})}
    assert "stage: steps 1..1 of 4 (add_noise off)" in texts["8"]
    assert "stage: steps 2..3 of 4 (add_noise off)" in texts["9"]
    assert any(line.startswith("contract enforced: wan2.2_t2v_A14b_high_noise") for line in texts["8"])
    prompt["8"]["inputs"]["end_step"] = 3
    refused = comfy.run(prompt)
    assert refused.error["node_id"] == "8"
    assert ("end_step 3 runs step 2 (σ=0.8333) on transformer_2, which carries no distill LoRA"
            in refused.error["exception_message"])
