"""Each family's workflow from single files: bit-identical to the diffusers-folder run in bf16, within a stated
tolerance from fp8 files."""

import pytest
import torch

from single_file_helpers import call, render

TINY = "lorabind-tiny/"
CASES = {
    "wan2.2": ("tiny-wan22-t2v", ["wan2.2_t2v_high_noise_tiny", "wan2.2_t2v_low_noise_tiny"], "wan_2.1_vae_tiny",
               "umt5_tiny", 5),
    "wan2.1": ("tiny-wan21-t2v", ["wan2.1_t2v_tiny"], "wan_2.1_vae_tiny", "umt5_tiny", 5),
    "qwen_image": ("tiny-qwen-image", ["qwen_image_tiny"], "qwen_image_vae_tiny", "qwen_2.5_vl_tiny", 1),
}
# fp8 e4m3 keeps 3 mantissa bits (relative step 2^-3 at worst, ~3% rms on random weights); after a few
# denoising steps and the VAE the decoded pixels (0..1) stay within these bounds of the bf16 run.
FP8_MAX_ABS = 0.25
FP8_MEAN_ABS = 0.03


@pytest.fixture
def models_root(single_file_root, registry_at):
    registry_at(single_file_root)
    return single_file_root


def _single_file_model(case: str, precision: str):
    folder, denoisers, vae, encoder, _ = CASES[case]
    encoder_file = f"{encoder}_bf16.safetensors"
    if precision != "bf16":  # the published text encoders come fp8 scaled only
        encoder_file = f"{encoder}_{'fp8_e4m3fn_scaled' if encoder == 'umt5_tiny' else 'fp8_scaled'}.safetensors"
    names = [f"{TINY}{stem}_{precision}.safetensors" for stem in denoisers]
    model, detected = call("LoraBindCheckpointLoader", denoiser=names[0],
                           denoiser_low_noise=names[1] if len(names) > 1 else "none",
                           vae=f"{TINY}{vae}.safetensors", text_encoder=f"{TINY}{encoder_file}", dtype="bfloat16")
    return model, detected


def _folder_run(case: str):
    folder, *_, frames = CASES[case]
    (model,) = call("LoraBindModelLoader", model_name=folder, dtype="bfloat16")
    return render(model, frames=frames)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_single_files_in_bf16_render_bit_identical_to_the_folder(models_root, case):
    model, detected = _single_file_model(case, "bf16")
    assert model.model.family == {"wan2.2": "wan2.2_moe", "wan2.1": "wan2.1", "qwen_image": "qwen_image"}[case]
    assert "(bf16)" in detected
    from_files = render(model, frames=CASES[case][-1])
    from_folder = _folder_run(case)
    assert from_files.shape == from_folder.shape and torch.equal(from_files, from_folder)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp8_e4m3fn", "fp8_scaled"])
@pytest.mark.parametrize("case", list(CASES))
def test_single_files_in_fp8_render_within_the_stated_tolerance(models_root, case, precision):
    model, detected = _single_file_model(case, precision)
    assert f"({precision})" in detected
    transformer = model.model.components["transformer"]
    fp8_weights = [p for p in transformer.parameters() if p.dtype == torch.float8_e4m3fn]
    assert fp8_weights, "fp8 weights must stay fp8 in memory"
    encoder = model.model.pipeline.text_encoder
    assert any(p.dtype == torch.float8_e4m3fn for p in encoder.parameters()), "the fp8 text encoder too"
    from_files = render(model, frames=CASES[case][-1])
    reference = _folder_run(case)
    difference = (from_files.float() - reference.float()).abs()
    assert difference.max().item() <= FP8_MAX_ABS and difference.mean().item() <= FP8_MEAN_ABS
    assert difference.max().item() > 0  # fp8 really changed the weights: the comparison can fail
