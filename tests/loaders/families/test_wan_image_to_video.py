"""Image-to-video on the three Wan variants: our sampler's latent equals WanImageToVideoPipeline's on the same
image, prompt, seed and explicit sigmas; TI2V keeps the encoded start image as the first latent frame exactly;
models and latents that do not fit are refused naming the input."""

import numpy as np
import pytest
import torch

from lorabind.loaders.contract_types import ResolvedSchedule
from lorabind.loaders.dispatch.generation_steps import denoise, empty_latent, encode_text, image_to_video_latent
from lorabind.loaders.generation.sampling import initial_noise
from wan_i2v_helpers import example_image, pipeline_on_sigmas

# Crosses both Wan2.2 boundaries (0.9 I2V) with uneven steps; the pipeline gets exactly these points.
SIGMAS = (1.0, 0.95, 0.875, 0.6, 0.3, 0.0)
SEED = 3


def _schedule(cfg):
    return ResolvedSchedule(sigmas=SIGMAS, steps=len(SIGMAS) - 1, cfg=cfg, shift=1.0)


def _pil(image):
    from PIL import Image

    return Image.fromarray((image[0].numpy() * 255 + 0.5).astype(np.uint8))


def _diffusers_latent(model, width, height, frames, cfg, end=None):
    """WanImageToVideoPipeline on the folder, FlowMatchEuler at shift 1 fed our sigmas (the pipeline has no
    ``sigmas`` argument: its scheduler's set_timesteps is given them, diffusers-feasibility.md §2)."""
    from diffusers import WanImageToVideoPipeline

    pipe = pipeline_on_sigmas(WanImageToVideoPipeline, model.path, SIGMAS)
    shape = empty_latent(model, width, height, frames).samples.shape
    extra = {"last_image": _pil(end)} if end is not None else {}
    return pipe(image=_pil(example_image("start")), prompt="a cat dancing", negative_prompt="blurry",
                height=height, width=width, num_frames=frames, num_inference_steps=len(SIGMAS) - 1,
                guidance_scale=cfg, latents=initial_noise(shape, SEED), output_type="latent", **extra).frames


def _ours(model, width, height, frames, cfg, end=None):
    latent = image_to_video_latent(model, example_image("start"), end, width, height, frames)
    positive, negative = encode_text(model, "a cat dancing"), encode_text(model, "blurry")
    return denoise(model, positive, negative, latent, _schedule(cfg), SEED), latent


@pytest.mark.parametrize("name, width, height, frames, cfg, with_end", [
    ("tiny-wan22-i2v", 32, 32, 5, 5.0, False),   # two experts, 36 channels, switch at 0.9
    ("tiny-wan22-i2v", 32, 48, 9, 1.0, True),    # first-and-last frame
    ("tiny-wan21-i2v", 32, 32, 5, 3.0, False),   # CLIP image branch
    ("tiny-wan22-ti2v", 64, 64, 5, 4.0, False),  # expand_timesteps, 48-channel VAE
])
@pytest.mark.slow
def test_latent_equals_the_diffusers_image_to_video_pipeline(load_tiny, name, width, height, frames, cfg, with_end):
    model = load_tiny(name)
    end = example_image("end") if with_end else None
    ours, _ = _ours(model, width, height, frames, cfg, end)
    reference = _diffusers_latent(model, width, height, frames, cfg, end)
    assert ours.samples.shape == reference.shape
    difference = float((ours.samples - reference).abs().max())
    assert difference < 2e-5, f"{name}: max |ours - diffusers| = {difference}"
    assert float(reference.abs().max()) > 0.5  # a real latent, not zeros on both sides


def test_frame_mask_marks_the_given_pixel_frames(load_tiny):
    """4 mask channels per latent frame, one per pixel frame it covers; the first latent frame covers the start
    frame alone (repeated 4x), so it is all ones; with an end image only the last pixel frame's channel is 1."""
    model = load_tiny("tiny-wan22-i2v")
    start_only = image_to_video_latent(model, example_image("start"), None, 32, 32, 9)
    with_end = image_to_video_latent(model, example_image("start"), example_image("end"), 32, 32, 9)
    mask_only, mask_end = start_only.extra["wan_image"].condition[0, :4], with_end.extra["wan_image"].condition[0, :4]
    assert mask_only.shape == (4, 3, 4, 4)
    assert mask_only[:, 0].eq(1).all() and mask_only[:, 1:].eq(0).all()
    assert mask_end[:, 0].eq(1).all() and mask_end[:, 1].eq(0).all()
    assert mask_end[3, 2].eq(1).all() and mask_end[:3, 2].eq(0).all()
    image_only, image_end = (latent.extra["wan_image"].condition[0, 4:] for latent in (start_only, with_end))
    assert torch.equal(image_only[:, 0], image_end[:, 0]) and not torch.equal(image_only[:, 2], image_end[:, 2])


def test_ti2v_first_latent_frame_is_the_vae_encoding_of_the_start_image_exactly(load_tiny):
    from diffusers.video_processor import VideoProcessor

    model = load_tiny("tiny-wan22-ti2v")
    result, _ = _ours(model, 64, 64, 5, 1.0)
    vae = model.pipeline.vae
    pixels = VideoProcessor(vae_scale_factor=16).preprocess(_pil(example_image("start")), height=64, width=64)
    with torch.no_grad():
        encoded = vae.encode(pixels.unsqueeze(2)).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    expected = (encoded - mean) * inverse_std
    assert torch.equal(result.samples[:, :, :1], expected)
    assert not torch.equal(result.samples[:, :, 1:], torch.zeros_like(result.samples[:, :, 1:]))


@pytest.mark.slow
def test_ti2v_runs_the_image_frame_at_timestep_zero(load_tiny):
    model = load_tiny("tiny-wan22-ti2v")
    seen = []
    hook = model.components["transformer"].register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["timestep"].clone()), with_kwargs=True)
    try:
        _ours(model, 64, 64, 5, 1.0)
    finally:
        hook.remove()
    tokens_per_frame = (64 // 16 // 2) ** 2
    for step, timestep in enumerate(seen):
        assert timestep.shape == (1, 2 * tokens_per_frame)
        assert timestep[0, :tokens_per_frame].eq(0).all()
        assert timestep[0, tokens_per_frame:].eq(SIGMAS[step] * 1000).all()


@pytest.mark.parametrize("name, end, message", [
    ("tiny-wan22-t2v", None, "'tiny-wan22-t2v' is a text-to-video model"),
    ("tiny-wan22-ti2v", "end", "end_image: model 'tiny-wan22-ti2v' (Wan2.2 TI2V) conditions on the first frame"),
    ("tiny-wan21-i2v", "end", "end_image: model 'tiny-wan21-i2v' (Wan2.1 I2V) encodes one image"),
])
def test_models_that_cannot_take_the_images_are_refused_naming_the_input(load_tiny, name, end, message):
    model = load_tiny(name)
    end_image = example_image("end") if end else None
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        image_to_video_latent(model, example_image("start"), end_image, 64, 64, 5)


@pytest.mark.slow
def test_sampler_refuses_a_plain_latent_on_an_i2v_model_and_an_image_latent_on_another_kind(load_tiny):
    from lorabind.loaders.dispatch.generation_steps import check_inputs

    i2v, ti2v = load_tiny("tiny-wan21-i2v"), load_tiny("tiny-wan22-ti2v")
    positive = encode_text(i2v, "a cat")
    with pytest.raises(ValueError, match="latent: model 'tiny-wan21-i2v' is image-to-video"):
        check_inputs(i2v, positive, None, empty_latent(i2v, 32, 32, 5), _schedule(1.0))
    ti2v_latent = image_to_video_latent(ti2v, example_image("start"), None, 64, 64, 5)
    with pytest.raises(ValueError, match="made from a start image for a Wan2.2 TI2V"):
        check_inputs(i2v, positive, None, ti2v_latent, _schedule(1.0))
    check_inputs(ti2v, encode_text(ti2v, "a cat"), None, empty_latent(ti2v, 64, 64, 5), _schedule(1.0))  # T2V too


@pytest.fixture(scope="module")
def flf2v_model(tmp_path_factory):
    """A tiny Wan2.1 FLF2V folder: the tiny Wan2.1 I2V with ``pos_embed_seq_len`` set, so its CLIP branch takes the
    start and end images' tokens together (2 x 17 here; 2 x 257 in the real FLF2V-14B). Built here, not shipped:
    it differs from ``tiny-wan21-i2v`` only by that field and its random weights."""
    from lorabind.loaders.models.store import load_model
    from lorabind.tiny_models._common import save_pipeline_atomically, seeded
    from lorabind.tiny_models.wan import tiny_transformer
    from lorabind.tiny_models.wan_i2v import (
        CLIP_HIDDEN,
        CLIP_IMAGE_SIZE,
        CLIP_PATCH,
        I2V_IN_CHANNELS,
        LATENT_CHANNELS,
        _i2v_pipeline,
    )

    pipeline = _i2v_pipeline(two_experts=False, image_encoder=True)
    clip_tokens = (CLIP_IMAGE_SIZE // CLIP_PATCH) ** 2 + 1
    with seeded(7):
        pipeline.transformer = tiny_transformer(I2V_IN_CHANNELS, LATENT_CHANNELS, image_dim=CLIP_HIDDEN,
                                                added_kv_proj_dim=24, pos_embed_seq_len=2 * clip_tokens)
    pipeline.register_modules(transformer=pipeline.transformer)
    folder = save_pipeline_atomically(pipeline, tmp_path_factory.mktemp("flf2v") / "tiny-wan21-flf2v")
    return load_model(str(folder), name="tiny-wan21-flf2v")


@pytest.mark.slow
def test_wan21_first_and_last_frame_equals_the_diffusers_pipeline(flf2v_model):
    """Wan2.1 FLF2V: both images go through the CLIP branch (the end image too) and the VAE condition."""
    end = example_image("end")
    ours, latent = _ours(flf2v_model, 32, 32, 9, 3.0, end)
    reference = _diffusers_latent(flf2v_model, 32, 32, 9, 3.0, end)
    condition = next(iter(latent.extra.values()))
    assert condition.has_end_image and condition.image_embeds.shape[0] == 2  # start and end image tokens
    difference = float((ours.samples - reference).abs().max())
    assert difference < 2e-5, f"max |ours - diffusers| = {difference}"
    swapped = denoise_with_images(flf2v_model, example_image("end"), example_image("start"))
    assert float((swapped.samples - ours.samples).abs().max()) > 1e-3  # the end image really conditions
    with pytest.raises(ValueError, match=r"end_image: model 'tiny-wan21-flf2v' is the Wan2\.1 first-and-last"):
        image_to_video_latent(flf2v_model, example_image("start"), None, 32, 32, 9)


def denoise_with_images(model, start, end):
    latent = image_to_video_latent(model, start, end, 32, 32, 9)
    positive, negative = encode_text(model, "a cat dancing"), encode_text(model, "blurry")
    return denoise(model, positive, negative, latent, _schedule(3.0), SEED)
