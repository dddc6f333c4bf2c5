"""Wan VACE: our sampler's latent equals WanVACEPipeline's with a control video, masks and reference images on
the same prompt, seed and explicit sigmas (Wan2.1 VACE and the Wan2.2 VACE Fun expert pair); the reference frames
are dropped when decoding; models and latents that do not fit are refused naming the input."""

import numpy as np
import pytest
import torch

from lorabind.loaders.contract_types import ResolvedSchedule
from lorabind.loaders.dispatch.generation_steps import (
    check_inputs,
    control_video_latent,
    decode,
    denoise,
    empty_latent,
    encode_text,
)
from lorabind.loaders.generation.sampling import initial_noise
from wan_i2v_helpers import example_control_clip as control_clip
from wan_i2v_helpers import example_image, pipeline_on_sigmas

# Crosses the Wan2.2 T2V boundary (0.875) with uneven steps; the pipeline gets exactly these points.
SIGMAS = (1.0, 0.95, 0.875, 0.6, 0.3, 0.0)
SEED = 5
WIDTH = HEIGHT = 32
FRAMES = 5


def _schedule(cfg):
    return ResolvedSchedule(sigmas=SIGMAS, steps=len(SIGMAS) - 1, cfg=cfg, shift=1.0)


def half_mask(frames=FRAMES, size=64):
    """MASK: keep the left half of every frame (0), generate the right half (1)."""
    mask = torch.zeros(frames, size, size)
    mask[:, :, size // 2:] = 1.0
    return mask


def _pil_frames(images):
    from PIL import Image

    return [Image.fromarray((frame.numpy() * 255 + 0.5).astype(np.uint8)) for frame in images]


def _pil_masks(masks):
    from PIL import Image

    return [Image.fromarray((frame.numpy() * 255 + 0.5).astype(np.uint8), mode="L") for frame in masks]


def _diffusers_latent(model, shape, cfg, strength, video, mask, reference):
    """WanVACEPipeline on the folder, FlowMatchEuler at shift 1 fed our sigmas (the pipeline has no ``sigmas``
    argument: its scheduler's set_timesteps is given them, diffusers-feasibility.md §2)."""
    from diffusers import WanVACEPipeline

    pipe = pipeline_on_sigmas(WanVACEPipeline, model.path, SIGMAS)
    extra = {"reference_images": _pil_frames(reference)} if reference is not None else {}
    if mask is not None:
        extra["mask"] = _pil_masks(mask)
    return pipe(video=_pil_frames(video), prompt="a cat dancing", negative_prompt="blurry", height=HEIGHT,
                width=WIDTH, num_frames=FRAMES, num_inference_steps=len(SIGMAS) - 1, guidance_scale=cfg,
                conditioning_scale=strength, latents=initial_noise(shape, SEED), output_type="latent",
                **extra).frames


def _ours(model, cfg, strength, video, mask, reference):
    latent = control_video_latent(model, video, mask, reference, WIDTH, HEIGHT, FRAMES, strength)
    positive, negative = encode_text(model, "a cat dancing"), encode_text(model, "blurry")
    return denoise(model, positive, negative, latent, _schedule(cfg), SEED), latent


@pytest.mark.parametrize("name, cfg, strength, with_mask", [
    ("tiny-wan21-vace", 4.0, 1.0, False),     # control video + reference image
    ("tiny-wan22-vace-fun", 3.0, 0.7, True),  # the expert pair (switch at 0.875), masks, scaled control
])
@pytest.mark.slow
def test_latent_equals_the_diffusers_vace_pipeline(load_tiny, name, cfg, strength, with_mask):
    model = load_tiny(name)
    video, reference = control_clip(), example_image("start")
    mask = half_mask() if with_mask else None
    ours, latent = _ours(model, cfg, strength, video, mask, reference)
    reference_latent = _diffusers_latent(model, latent.samples.shape, cfg, strength, video, mask, reference)
    assert ours.samples.shape == reference_latent.shape == (1, 16, 3, 4, 4)  # 1 reference + 2 video frames
    difference = float((ours.samples - reference_latent).abs().max())
    assert difference < 2e-5, f"{name}: max |ours - diffusers| = {difference}"
    assert float(reference_latent.abs().max()) > 0.5  # a real latent, not zeros on both sides


@pytest.mark.slow
def test_the_control_changes_the_result_and_strength_zero_removes_it(load_tiny):
    model = load_tiny("tiny-wan21-vace")
    with_control, _ = _ours(model, 1.0, 1.0, control_clip(), None, None)
    other_control, _ = _ours(model, 1.0, 1.0, control_clip().flip(0), None, None)
    off, _ = _ours(model, 1.0, 0.0, control_clip(), None, None)
    off_other, _ = _ours(model, 1.0, 0.0, control_clip().flip(0), None, None)
    assert float((with_control.samples - other_control.samples).abs().max()) > 1e-3
    assert torch.equal(off.samples, off_other.samples)  # scale 0: the hints add nothing


def test_control_latent_layout_mask_channels_and_reference_frames(load_tiny):
    """96 control channels: 16 inactive + 16 reactive video latents + 64 mask channels (one per pixel of the 8x8
    cell); a reference image is one more latent frame in front, with a zero mask and zero reactive half."""
    model = load_tiny("tiny-wan21-vace")
    latent = control_video_latent(model, control_clip(), half_mask(size=32), example_image("start"), 32, 32, 5)
    control = latent.extra["wan_vace"].control
    assert latent.samples.shape == (1, 16, 3, 4, 4) and control.shape == (1, 96, 3, 4, 4)
    assert control[:, 16:32, 0].eq(0).all() and control[:, 32:, 0].eq(0).all()  # the reference frame
    assert control[:, 32:, 1:, :, :2].eq(0).all() and control[:, 32:, 1:, :, 2:].eq(1).all()  # left kept
    plain = control_video_latent(model, None, None, None, 32, 32, 5)
    assert plain.samples.shape == (1, 16, 2, 4, 4) and plain.extra["wan_vace"].control[:, 32:].eq(1).all()


def test_decoding_drops_the_reference_frames(load_tiny):
    model = load_tiny("tiny-wan21-vace")
    latent = control_video_latent(model, control_clip(), None, example_image("start"), 32, 32, 5)
    noisy = type(latent)(samples=torch.randn(latent.samples.shape, generator=torch.Generator().manual_seed(0)),
                         family=latent.family, kind=latent.kind, extra=latent.extra)
    plain = type(latent)(samples=noisy.samples[:, :, 1:], family=latent.family, kind=latent.kind)
    frames = decode(model, noisy)
    assert frames.shape == (5, 32, 32, 3)
    assert torch.equal(frames, decode(model, plain))


@pytest.mark.parametrize("name, inputs, message", [
    ("tiny-wan21-t2v", {}, "model 'tiny-wan21-t2v' has no VACE control branch"),
    ("tiny-wan21-vace", {"reference_images": torch.zeros(5, 32, 32, 3)}, "reference_images: 5 images given"),
    ("tiny-wan21-vace", {"control_masks": torch.zeros(1, 2, 32, 32, 1)}, "control_masks: expected a ComfyUI MASK"),
    ("tiny-wan21-vace", {"control_video": torch.zeros(32, 32)}, "control_video: expected a ComfyUI IMAGE"),
])
def test_inputs_a_model_cannot_take_are_refused_naming_them(load_tiny, name, inputs, message):
    arguments = {"control_video": None, "control_masks": None, "reference_images": None, **inputs}
    with pytest.raises(ValueError, match=message):
        control_video_latent(load_tiny(name), width=32, height=32, frames=5, **arguments)


def test_sampler_refuses_a_plain_latent_on_a_vace_model_and_a_control_latent_elsewhere(load_tiny):
    vace, t2v = load_tiny("tiny-wan21-vace"), load_tiny("tiny-wan21-t2v")
    positive = encode_text(vace, "a cat")
    with pytest.raises(ValueError, match="latent: model 'tiny-wan21-vace' is a Wan VACE model"):
        check_inputs(vace, positive, None, empty_latent(vace, 32, 32, 5), _schedule(1.0))
    control = control_video_latent(vace, None, None, None, 32, 32, 5)
    with pytest.raises(ValueError, match="made with VACE control inputs, but model 'tiny-wan21-t2v'"):
        check_inputs(t2v, encode_text(t2v, "a cat"), None, control, _schedule(1.0))


def test_the_node_bounds_the_sizes_a_request_controls():
    from lorabind.nodes.latent_nodes import LoraBindVaceToVideo

    assert LoraBindVaceToVideo.VALIDATE_INPUTS(width=32, height=32, frames=5, batch_size=1) is True
    refused = LoraBindVaceToVideo.VALIDATE_INPUTS(width=8192, height=8192, frames=1025, batch_size=64)
    assert "lower the size, frames or batch" in refused
    too_narrow = LoraBindVaceToVideo.VALIDATE_INPUTS(width=8, height=32, frames=5, batch_size=1)
    assert too_narrow == "width 8 is outside 16..8192"
