"""The ComfyUI-native nodes headless: declared like every node, and refused with a sentence naming ComfyUI (not
an import error) when a workflow reaches them outside ComfyUI."""

import subprocess
import sys
from pathlib import Path

import pytest

from lorabind.loaders.errors import LoraBindError
from lorabind.nodes import NODE_CLASS_MAPPINGS
from lorabind.nodes.comfy_native_nodes import (
    LoraBindContractSigmas,
    LoraBindLoRA,
    LoraBindLoRAPair,
    LoraBindPEFTAdapter,
)

PACK = Path(__file__).resolve().parents[2]


def test_the_native_nodes_are_registered_in_their_own_category():
    for name in ("LoraBindLoRA", "LoraBindLoRAPair", "LoraBindPEFTAdapter", "LoraBindContractSigmas"):
        assert NODE_CLASS_MAPPINGS[name].CATEGORY == "lorabind/ComfyUI models"
    assert LoraBindLoRAPair.RETURN_TYPES == ("MODEL", "MODEL", "SIGMAS", "SIGMAS", "INT")


@pytest.mark.parametrize("call, node", [
    (lambda: LoraBindLoRA().apply(object(), "x.safetensors", 1.0), "LoraBindLoRA"),
    (lambda: LoraBindLoRAPair().pair(object(), object(), "a", "b", 1.0, 1.0, 0.875), "LoraBindLoRAPair"),
    (lambda: LoraBindPEFTAdapter().apply(object(), "style-peft", 1.0), "LoraBindPEFTAdapter"),
    (lambda: LoraBindContractSigmas().sigmas(object()), "LoraBindContractSigmas"),
])
def test_headless_each_native_node_says_it_needs_comfyui(call, node):
    with pytest.raises(LoraBindError) as refused:
        call()
    assert str(refused.value).startswith(f"{node} works on ComfyUI's own MODEL and needs ComfyUI")


@pytest.mark.parametrize("shipped", [PACK / folder / f"{name}{form}" for name in (
    "comfy_wan22_lightx2v_4step", "comfy_qwen_image_lightning", "comfy_minimax_h3_turbo_4step_768p")
    for folder, form in (("workflows/api", ".api.json"), ("workflows", ".json"))],
    ids=lambda path: path.name)
def test_lorabind_run_refuses_the_comfyui_example_naming_comfyui(tmp_path, shipped):
    run = subprocess.run([sys.executable, "-m", "lorabind.runtime.cli", "run", str(shipped), "--models",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "run such a workflow inside ComfyUI" in run.stderr + run.stdout


def test_the_pair_returns_the_same_patched_expert_when_only_the_other_one_changed(monkeypatch):
    """A new clone of an unchanged expert makes ComfyUI patch it again in full (bench_comfyui): the pair node
    hands back last run's object for the expert whose model, file, strength and options are the same."""
    from types import SimpleNamespace

    from lorabind.nodes import comfy_native_nodes as native

    applied = []

    def apply(model, prepared, lora, strength, enforce, part, switch, where):
        applied.append((part, strength))
        return SimpleNamespace(base=model, lora=lora, strength=strength), [f"{lora} at {strength}"]

    monkeypatch.setattr(native.comfy_bridge, "require_comfyui", lambda where: None)
    monkeypatch.setattr(native.comfy_patches, "model_shapes", lambda model: {})
    monkeypatch.setattr(native, "host_family", lambda shapes, where: "wan")
    monkeypatch.setattr(native, "check_expert_pair", lambda *args: None)
    monkeypatch.setattr(native, "prepare_lora", lambda *args, **kwargs: SimpleNamespace(contract=None, report={}))
    monkeypatch.setattr(native, "lora_inputs_identity", lambda name: f"identity of {name}")
    monkeypatch.setattr(native, "apply_lora", apply)
    node, high, low = LoraBindLoRAPair(), object(), object()
    first = node.pair(high, low, "h.safetensors", "l.safetensors", 1.0, 1.0, 0.875)["result"]
    changed = node.pair(high, low, "h.safetensors", "l.safetensors", 0.5, 1.0, 0.875)["result"]
    assert changed[1] is first[1] and changed[0] is not first[0] and changed[0].strength == 0.5
    other_model = node.pair(high, object(), "h.safetensors", "l.safetensors", 0.5, 1.0, 0.875)["result"]
    swapped = node.pair(high, low, "h.safetensors", "l2.safetensors", 0.5, 1.0, 0.875)["result"]
    assert other_model[0] is changed[0] and other_model[1] is not first[1]
    assert swapped[1].lora == "l2.safetensors"
    assert applied == [("high", 1.0), ("low", 1.0), ("high", 0.5), ("low", 1.0), ("low", 1.0)]
