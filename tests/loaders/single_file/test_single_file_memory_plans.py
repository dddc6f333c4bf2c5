"""Single files under the folder loader's memory plans: every plan renders bit-identical to ``full`` on the CPU,
and a plan that cannot fit is refused before any weight is read, naming needed and free memory."""

import pytest
import torch

from lorabind.loaders.errors import ModelLoadError
from single_file_helpers import call, render

TINY = "lorabind-tiny/"
WAN22_FP8 = dict(denoiser=f"{TINY}wan2.2_t2v_high_noise_tiny_fp8_e4m3fn.safetensors",
                 denoiser_low_noise=f"{TINY}wan2.2_t2v_low_noise_tiny_fp8_e4m3fn.safetensors",
                 vae=f"{TINY}wan_2.1_vae_tiny.safetensors",
                 text_encoder=f"{TINY}umt5_tiny_fp8_e4m3fn_scaled.safetensors", dtype="bfloat16")


@pytest.fixture
def models_root(single_file_root, registry_at):
    registry_at(single_file_root)
    return single_file_root


def _load(memory: str):
    model, _ = call("LoraBindCheckpointLoader", device="cpu", memory=memory, **WAN22_FP8)
    return model


@pytest.mark.slow
def test_every_memory_plan_renders_bit_identical_to_full(models_root):
    reference = render(_load("full"), frames=5)
    for memory in ("swap_experts", "offload_model", "offload_blocks"):
        model = _load(memory)
        assert model.model.placement.plan.memory == memory  # its own cache entry, placed under that plan
        assert torch.equal(render(model, frames=5), reference), memory


def test_a_plan_that_cannot_fit_is_refused_before_loading(models_root, monkeypatch):
    from lorabind.loaders.models import store as model_store
    from lorabind.loaders.models.single_file import pipelines
    from lorabind.loaders.placement import load_plan

    model_store.clear_cache()  # the first test's models are cached; this load must plan afresh
    monkeypatch.setattr(load_plan, "free_memory", lambda device: (1024, None))
    monkeypatch.setattr(pipelines, "load_component", lambda *a, **k: pytest.fail("weights were read"))
    with pytest.raises(ModelLoadError) as error:
        _load("full")
    text = str(error.value)
    assert "wan2.2_t2v_high_noise_tiny_fp8_e4m3fn.safetensors" in text and "Nothing was loaded" in text
    assert "of device memory (0.0 GiB free)" in text  # what it needs and what is free


def _detected_set(root, precision: str):
    from lorabind.loaders.models.single_file.detect import check_set, detect

    def one(folder, name):
        return detect(str(root / folder / "lorabind-tiny" / name), name)

    return check_set([one("diffusion_models", f"wan2.2_t2v_{e}_noise_tiny_{precision}.safetensors")
                      for e in ("high", "low")], one("vae", "wan_2.1_vae_tiny.safetensors"),
                     one("text_encoders", "umt5_tiny_fp8_e4m3fn_scaled.safetensors"))


def _held_bytes(module) -> int:
    return sum(t.nbytes for t in module.parameters()) + sum(t.nbytes for t in module.buffers())


@pytest.mark.parametrize("precision", ["bf16", "fp8_e4m3fn"])
def test_planned_bytes_are_what_loading_holds_fp8_at_one_byte(single_file_root, precision):
    """The plan sizes each file as loaded: weights kept fp8 at one byte (not at the compute dtype), the
    dequantized keep-in-float32 modules at four; only the file headers are read to know which."""
    from lorabind.loaders.models.single_file.loading import load_component
    from lorabind.loaders.models.single_file.pipelines import SingleFileSet

    source = SingleFileSet(_detected_set(single_file_root, precision))
    planned = {size.name: size.bytes for size in source.component_sizes(torch.bfloat16)}
    held = {name: _held_bytes(load_component(detected, dtype=torch.bfloat16))
            for name, detected in source.named.items()}
    assert planned == held
    if precision == "fp8_e4m3fn":
        bf16 = {size.name: size.bytes
                for size in SingleFileSet(_detected_set(single_file_root, "bf16")).component_sizes(torch.bfloat16)}
        assert planned["transformer"] < bf16["transformer"] and planned["vae"] == bf16["vae"]
