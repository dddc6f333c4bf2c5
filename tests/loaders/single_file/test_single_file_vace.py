"""Wan VACE from single files in ComfyUI's layout (``vace_blocks.N.before_proj``/``after_proj``,
``vace_patch_embedding``): the tiny Wan2.1 VACE file and the Wan2.2 VACE Fun expert pair load through
LoraBindCheckpointLoader as a ``WanVACEPipeline`` and render bit-identical (bf16) to the diffusers-folder run with
a control video and a reference image; a VACE file is never taken for a plain Wan transformer of the same widths."""

import pytest
import torch

from lorabind.loaders.models.single_file.detect import detect
from single_file_helpers import SAMPLER, call
from wan_i2v_helpers import example_control_clip as control_clip
from wan_i2v_helpers import example_image

TINY = "lorabind-tiny/"
CASES = {  # folder, denoiser stems, family, boundary_ratio
    "wan2.1_vace": ("tiny-wan21-vace", ["wan2.1_vace_tiny"], "wan2.1", None),
    "wan2.2_vace_fun": ("tiny-wan22-vace-fun", ["wan2.2_fun_vace_high_noise_tiny", "wan2.2_fun_vace_low_noise_tiny"],
                        "wan2.2_moe", 0.875),
}


@pytest.fixture
def models_root(single_file_root, registry_at):
    registry_at(single_file_root)
    return single_file_root


def _files(stems, precision="bf16"):
    names = [f"{TINY}{stem}_{precision}.safetensors" for stem in stems]
    return dict(denoiser=names[0], denoiser_low_noise=names[1] if len(names) > 1 else "none",
                vae=f"{TINY}wan_2.1_vae_tiny.safetensors", text_encoder=f"{TINY}umt5_tiny_bf16.safetensors",
                clip_vision="none", dtype="bfloat16")


def _render(model):
    """Control clip + reference image -> VACE latent -> sampler -> decode, on the node classes."""
    (positive,) = call("LoraBindTextEncode", model=model, text="a cat dancing on the street")
    (negative,) = call("LoraBindTextEncode", model=model, text="blurry, low quality")
    encoded = call("LoraBindVaceToVideo", model=model, width=32, height=32, frames=5, batch_size=1, strength=1.0,
                   control_video=control_clip(), reference_images=example_image("start"))
    (latent,) = encoded["result"]  # with the resize notes: the 64x64 inputs are fitted to 32x32
    sampled = call("LoraBindSampler", model=model, positive=positive, negative=negative, latent=latent, **SAMPLER)
    (images,) = call("LoraBindVAEDecode", model=model, latent=sampled["result"][0])
    return images


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_vace_single_files_in_bf16_render_bit_identical_to_the_folder(models_root, case):
    folder, stems, family, boundary = CASES[case]
    model, detected = call("LoraBindCheckpointLoader", **_files(stems))
    assert model.model.family == family and model.model.model_index["_class_name"] == "WanVACEPipeline"
    assert model.model.model_index.get("boundary_ratio") == boundary
    assert "VACE tiny" in detected and "(bf16)" in detected
    from_files = _render(model)
    (folder_model,) = call("LoraBindModelLoader", model_name=folder, dtype="bfloat16")
    from_folder = _render(folder_model)
    assert from_files.shape == from_folder.shape == (5, 32, 32, 3)
    assert torch.equal(from_files, from_folder)


def test_the_file_is_in_comfyuis_layout_and_detected_as_vace_not_as_a_plain_wan_transformer(models_root):
    from safetensors import safe_open

    name = f"{TINY}wan2.1_vace_tiny_bf16.safetensors"
    path = models_root / "diffusion_models" / name
    with safe_open(str(path), "pt") as handle:
        keys = set(handle.keys())
    assert {"vace_patch_embedding.weight", "vace_blocks.0.before_proj.weight", "vace_blocks.1.after_proj.weight",
            "vace_blocks.1.self_attn.q.weight", "blocks.3.cross_attn.o.weight", "head.modulation"} <= keys
    assert "vace_blocks.1.before_proj.weight" not in keys  # only the first VACE block projects its input
    found = detect(str(path), name)
    assert (found.kind.kind, found.model.variant, found.title) == ("wan_vace_transformer", "vace", "Wan2.1 VACE tiny")
