"""The memory plans on a real CUDA device: placement, group offload with streams keeping a fuse, the expert swap
and its timing path, giving VRAM back. Skipped without CUDA (CI has none); run on a GPU machine."""

import dataclasses
import types

import pytest
import torch

from lorabind.loaders.binding.bind import bind, unbind
from lorabind.loaders.dispatch.generation_steps import denoise, empty_latent, encode_text
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.models import store as model_store
from lorabind.loaders.placement import load_plan
from lorabind.tiny_models import lora_fixtures as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SCHEDULE = types.SimpleNamespace(sigmas=(1.0, 0.9375, 0.833333, 0.625, 0.0), cfg=1.0, boundary=None, steps=4)


def _load(root, name, memory):
    return model_store.load_model(root / "diffusers" / name, device="cuda", memory=memory)


def _sample(model):
    positive = encode_text(model, "a red fox")
    return denoise(model, positive, None, empty_latent(model, 16, 16, frames=1), SCHEDULE, seed=3).samples


def test_full_plan_puts_every_component_on_the_gpu(tiny_models_root):
    model = _load(tiny_models_root, "tiny-wan22-t2v", "full")
    for name, module in model.pipeline.components.items():
        if isinstance(module, torch.nn.Module):
            assert {p.device.type for p in module.parameters()} == {"cuda"}, name
    assert set(model.placement.describe()["components"].values()) == {"cuda:0"}


@pytest.mark.parametrize("memory", ["swap_experts", "offload_model", "offload_blocks"])
def test_fuses_hold_under_every_plan_on_the_gpu(tiny_models_root, memory):
    """offload_blocks uses diffusers' group offload with a CUDA stream: onload copies the pinned CPU snapshot, so a
    fuse must land there (it does: we write between forwards, when the parameters ARE that snapshot)."""
    fuses = [FuseSpec(str(tiny_models_root / "loras" / F.WAN22_HIGH), 1.0, "transformer"),
             FuseSpec(str(tiny_models_root / "loras" / F.WAN22_LOW), 1.0, "transformer_2")]
    reference = _load(tiny_models_root, "tiny-wan22-t2v", "full")
    base = _sample(reference)
    bind(reference, fuses, [])
    fused = _sample(reference)
    unbind(reference)
    model = _load(tiny_models_root, "tiny-wan22-t2v", memory)
    assert torch.equal(_sample(model), base)
    bind(model, fuses, [])
    assert torch.equal(_sample(model), fused)
    assert torch.equal(_sample(model), fused)  # a second run after every offload/swap still has the fuse
    unbind(model)
    assert torch.equal(_sample(model), base)


def test_expert_swap_on_the_gpu_times_one_upload_per_swap(tiny_models_root, monkeypatch):
    plan_for = load_plan.choose_plan
    monkeypatch.setattr(load_plan, "choose_plan",
                        lambda *a, **k: dataclasses.replace(plan_for(*a, **k), prefetch=False))
    model_store.clear_cache()
    try:
        model = _load(tiny_models_root, "tiny-wan22-t2v", "swap_experts")
        _sample(model)
        stats = model.placement.stats
        assert stats.swaps == 1 and stats.upload_seconds > 0
        low = model.components["transformer_2"]
        assert next(low.parameters()).device.type == "cuda"
        assert next(model.components["transformer"].parameters()).is_pinned()  # host copy, pinned for the swap
    finally:
        model_store.clear_cache()


def test_release_gives_vram_back_and_the_next_run_is_unchanged(tiny_models_root):
    model = _load(tiny_models_root, "tiny-wan21-t2v", "full")
    before = _sample(model)
    allocated = torch.cuda.memory_allocated()
    assert model_store.release_device_memory() >= 1
    assert torch.cuda.memory_allocated() < allocated
    assert torch.equal(_sample(model), before)
