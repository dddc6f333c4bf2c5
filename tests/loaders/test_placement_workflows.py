"""Every runnable example workflow, run headless on the CPU under every memory plan, gives outputs bit-identical
to ``memory=full``; the plan's mechanisms really ran (staged uploads, group-offload hooks installed).

On the CPU the "device" is the host, so the offload plans move weights between two host copies and run
diffusers' group-offload hooks with onload device cpu: the same code paths a GPU takes, minus the streams.
"""

import json
import os
from pathlib import Path

import pytest
import torch

import lorabind
from lorabind.tiny_models import unavailable_builtins

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
RUNNABLE = ["wan22_lightx2v_4step", "wan21_distill", "qwen_image_lightning", "peft_two_branches",
            "minimax_h3_native"]
OFFLOAD_PLANS = ["swap_experts", "offload_model", "offload_blocks"]


class CaptureOutput:
    """Test-only stand-in for the save nodes: keeps the image/audio tensors so plans can be compared bit for bit."""

    captured: dict = {}
    CATEGORY = "tests"
    FUNCTION = "capture"
    OUTPUT_NODE = True
    RETURN_TYPES = ()

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"key": ("STRING", {"default": ""})},
                "optional": {"images": ("IMAGE",), "audio": ("AUDIO",)}}

    def capture(self, key, images=None, audio=None):
        CaptureOutput.captured[key] = images.clone() if images is not None else audio["waveform"].clone()
        return {"ui": {"text": [key]}}


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    from lorabind.tiny_models import build_tiny
    from lorabind.tiny_models.lora_fixtures import write_fixture_loras

    root = tmp_path_factory.mktemp("placement_models")
    build_tiny(root)
    write_fixture_loras(root)
    return root


@pytest.fixture
def executor(models_root, tmp_path):
    from lorabind.nodes import NODE_CLASS_MAPPINGS
    from lorabind.runtime import folder_paths
    from lorabind.runtime.executor import PromptExecutor

    folder_paths.configure(models_root=str(models_root), output_dir=str(tmp_path / "out"),
                           input_dir=str(tmp_path / "in"))
    return PromptExecutor(dict(NODE_CLASS_MAPPINGS, CaptureOutput=CaptureOutput), cache=False)


def _prompt(name: str, memory: str) -> dict:
    """The workflow with every loader on cpu under ``memory`` and every save node capturing instead."""
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    for node_id, node in prompt.items():
        if node["class_type"] == "LoraBindModelLoader":
            node["inputs"].update(device="cpu", memory=memory)
        elif node["class_type"] in ("LoraBindSaveImage", "LoraBindSaveAudio"):
            kept = {k: v for k, v in node["inputs"].items() if k in ("images", "audio")}
            prompt[node_id] = {"class_type": "CaptureOutput", "inputs": {**kept, "key": f"{memory}:{node_id}"}}
    return prompt


def _run(executor, name: str, memory: str) -> dict:
    CaptureOutput.captured.clear()
    result = executor.execute(_prompt(name, memory), f"{name}-{memory}")
    assert result.success, result.error
    outputs = {key.split(":", 1)[1]: value for key, value in CaptureOutput.captured.items()}
    assert outputs, "the workflow produced nothing to compare"
    samplers = [ui["lorabind_schedule"][0]["placement"] for ui in result.outputs.values() if "lorabind_schedule" in ui]
    return {"outputs": outputs, "placements": samplers}


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_memory_plan_gives_the_full_plans_outputs_bit_for_bit(name, executor):
    if name.startswith("minimax") and "tiny-minimax-h3" in unavailable_builtins():
        pytest.skip(unavailable_builtins()["tiny-minimax-h3"])
    full = _run(executor, name, "full")
    assert all(p["memory"] == "full" and set(p["components"].values()) == {"cpu"} for p in full["placements"])
    two_experts = "wan22" in name
    for memory in OFFLOAD_PLANS:
        if memory == "swap_experts" and not two_experts:
            result = executor.execute(_prompt(name, memory), f"{name}-{memory}")
            assert not result.success
            assert "swap_experts needs a model with two experts" in result.error["exception_message"]
            assert "Nothing was loaded" in result.error["exception_message"]
            continue
        got = _run(executor, name, memory)
        assert got["outputs"].keys() == full["outputs"].keys()
        for key, value in full["outputs"].items():
            assert torch.equal(got["outputs"][key], value), (memory, key)
        for placed in got["placements"]:
            assert placed["memory"] == memory
            if memory == "offload_blocks":
                assert any("streamed to cpu by blocks" in where for where in placed["components"].values())
            else:  # staged: the denoisers were uploaded from their host copies at least once
                assert placed["uploads"].get("transformer", 0) >= 1, placed


def test_group_offload_hooks_are_installed_and_used_under_offload_blocks(executor, models_root):
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    from lorabind.loaders.models.store import load_model

    model = load_model(models_root / "diffusers" / "tiny-wan21-t2v", device="cpu", memory="offload_blocks")
    transformer = model.components["transformer"]
    assert _is_group_offload_enabled(transformer)
    onloads = []
    block_hook = transformer.blocks[0]._diffusers_hook.get_hook("group_offloading")
    original = block_hook.group.onload_
    block_hook.group.onload_ = lambda: (onloads.append(1), original())[1]
    try:
        _run(executor, "wan21_distill", "offload_blocks")
    finally:
        block_hook.group.onload_ = original
    assert len(onloads) == 4  # one onload of block 0 per step: the hooks really ran
