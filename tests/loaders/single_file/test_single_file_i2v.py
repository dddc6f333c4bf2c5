"""Image-to-video from single files: the tiny Wan2.2 I2V expert pair, Wan2.1 I2V (with its CLIP vision file) and
Wan2.2 TI2V-5B (with the Wan2.2 VAE file) load through LoraBindCheckpointLoader and render bit-identical (bf16) to
the diffusers-folder run; a Wan2.1 I2V denoiser without its image encoder, or an image encoder with a model that
has no image branch, is refused."""

import pytest
import torch

from lorabind.loaders.errors import ModelLoadError
from single_file_helpers import SAMPLER, call
from wan_i2v_helpers import example_image

TINY = "lorabind-tiny/"
CLIP = f"{TINY}clip_vision_tiny.safetensors"
CASES = {  # folder, denoiser stems, clip_vision, VAE, size, family, pipeline class
    "wan2.2_i2v": ("tiny-wan22-i2v", ["wan2.2_i2v_high_noise_tiny", "wan2.2_i2v_low_noise_tiny"], "none",
                   "wan_2.1_vae_tiny", 32, "wan2.2_moe", "WanImageToVideoPipeline"),
    "wan2.1_i2v": ("tiny-wan21-i2v", ["wan2.1_i2v_tiny"], CLIP, "wan_2.1_vae_tiny", 32, "wan2.1",
                   "WanImageToVideoPipeline"),
    # the TI2V-5B folder is a WanPipeline with expand_timesteps; its VAE compresses 32x with the 2x2 patch
    "wan2.2_ti2v": ("tiny-wan22-ti2v", ["wan2.2_ti2v_tiny"], "none", "wan2.2_vae_tiny", 64, "wan2.1", "WanPipeline"),
}


@pytest.fixture
def models_root(single_file_root, registry_at):
    registry_at(single_file_root)
    return single_file_root


def _files(stems, clip_vision, vae="wan_2.1_vae_tiny", precision="bf16"):
    names = [f"{TINY}{stem}_{precision}.safetensors" for stem in stems]
    return dict(denoiser=names[0], denoiser_low_noise=names[1] if len(names) > 1 else "none",
                vae=f"{TINY}{vae}.safetensors", text_encoder=f"{TINY}umt5_tiny_bf16.safetensors",
                clip_vision=clip_vision, dtype="bfloat16")


def _render(model, size):
    """Start image -> I2V latent -> sampler -> decode, on the node classes."""
    (positive,) = call("LoraBindTextEncode", model=model, text="a cat dancing on the street")
    (negative,) = call("LoraBindTextEncode", model=model, text="blurry, low quality")
    encoded = call("LoraBindImageToVideo", model=model, start_image=example_image("start"), width=size,
                   height=size, frames=5, batch_size=1)
    (latent,) = encoded["result"] if isinstance(encoded, dict) else encoded  # with a resize note when resized
    sampled = call("LoraBindSampler", model=model, positive=positive, negative=negative, latent=latent, **SAMPLER)
    (images,) = call("LoraBindVAEDecode", model=model, latent=sampled["result"][0])
    return images


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_i2v_single_files_in_bf16_render_bit_identical_to_the_folder(models_root, case):
    folder, stems, clip_vision, vae, size, family, pipeline_class = CASES[case]
    model, detected = call("LoraBindCheckpointLoader", **_files(stems, clip_vision, vae))
    assert model.model.family == family
    assert model.model.model_index["_class_name"] == pipeline_class
    assert "I2V tiny" in detected and "(bf16)" in detected
    from_files = _render(model, size)
    (folder_model,) = call("LoraBindModelLoader", model_name=folder, dtype="bfloat16")
    from_folder = _render(folder_model, size)
    assert from_files.shape == from_folder.shape == (5, size, size, 3)
    assert torch.equal(from_files, from_folder)


def test_ti2v_single_files_assemble_as_the_ti2v_folder_with_expand_timesteps(models_root):
    model, _ = call("LoraBindCheckpointLoader", **_files(["wan2.2_ti2v_tiny"], "none", "wan2.2_vae_tiny"))
    assert model.model.model_index["expand_timesteps"] is True


def test_wan22_i2v_experts_get_the_published_i2v_boundary(models_root):
    model, _ = call("LoraBindCheckpointLoader", **_files(CASES["wan2.2_i2v"][1], "none"))
    assert model.model.model_index["boundary_ratio"] == 0.9


def test_wan21_i2v_without_its_image_encoder_is_refused_naming_the_file(models_root):
    with pytest.raises(ModelLoadError) as error:
        call("LoraBindCheckpointLoader", **_files(["wan2.1_i2v_tiny"], "none"))
    text = str(error.value)
    assert "wan2.1_i2v_tiny_bf16.safetensors: Wan2.1 I2V tiny (bf16)" in text and "clip_vision" in text


@pytest.mark.parametrize("stems", [["wan2.2_i2v_high_noise_tiny", "wan2.2_i2v_low_noise_tiny"], ["wan2.1_t2v_tiny"]])
def test_an_image_encoder_with_a_model_without_an_image_branch_is_refused_naming_both(models_root, stems):
    with pytest.raises(ModelLoadError) as error:
        call("LoraBindCheckpointLoader", **_files(stems, CLIP))
    text = str(error.value)
    assert f"{stems[0]}_bf16.safetensors" in text and "clip_vision_tiny.safetensors" in text
    assert "takes no image encoder" in text
