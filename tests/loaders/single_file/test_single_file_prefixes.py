"""Issue 28: a single file whose keys carry the prefix ComfyUI's savers write (``model.diffusion_model.`` from
CheckpointSave, ``diffusion_model.``) loads and renders exactly like the unprefixed file; an unknown prefix is
refused naming it."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lorabind.loaders.errors import LoraBindError
from single_file_helpers import call, render

TINY = "lorabind-tiny/"
DENOISER = "wan2.1_t2v_tiny_bf16.safetensors"


def _resave(root, prefix: str, name: str) -> str:
    folder = root / "diffusion_models" / TINY
    with safe_open(str(folder / DENOISER), framework="pt") as handle:
        tensors = {prefix + key: handle.get_tensor(key) for key in handle.keys()}
        metadata = handle.metadata()
    save_file(tensors, str(folder / name), metadata=metadata)
    return f"{TINY}{name}"


def _render(denoiser: str):
    model, _ = call("LoraBindCheckpointLoader", denoiser=denoiser, denoiser_low_noise="none",
                    vae=f"{TINY}wan_2.1_vae_tiny.safetensors", text_encoder=f"{TINY}umt5_tiny_bf16.safetensors",
                    dtype="bfloat16")
    return render(model, frames=5)


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["model.diffusion_model.", "diffusion_model."])
def test_a_prefixed_single_file_renders_identically(single_file_root, registry_at, prefix):
    registry_at(single_file_root)
    prefixed = _resave(single_file_root, prefix, f"wan2.1_t2v_tiny_{prefix.replace('.', '_')}bf16.safetensors")
    assert torch.equal(_render(prefixed), _render(f"{TINY}{DENOISER}"))


def test_an_unknown_prefix_is_refused_naming_it(single_file_root, registry_at):
    registry_at(single_file_root)
    odd = _resave(single_file_root, "net.unet.", "wan2.1_t2v_tiny_oddprefix_bf16.safetensors")
    with pytest.raises(LoraBindError) as caught:
        _render(odd)
    assert "net.unet." in str(caught.value)
