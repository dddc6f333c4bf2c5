"""The flow-matching Euler sampler: expert routing, CFG passes, determinism, interrupts, diffusers parity."""

import numpy as np
import pytest
import torch

from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch.contract_discovery import ResolvedSchedule
from lorabind.loaders.dispatch.generation_steps import decode, denoise, empty_latent, encode_text
from lorabind.loaders.families.qwen_image.prediction import pack_qwen_latents, unpack_qwen_latents
from lorabind.loaders.generation.sampling import initial_noise
from lorabind.runtime.context import InterruptedByUser

# Crosses the 0.875 boundary, with one point exactly on it (σ·1000 ≥ boundary·1000 -> high-noise expert).
SIGMAS = (1.0, 0.95, 0.875, 0.6, 0.3, 0.0)


def _schedule(sigmas=SIGMAS, cfg=5.0, boundary=None):
    return ResolvedSchedule(sigmas=tuple(sigmas), steps=len(sigmas) - 1, cfg=cfg, shift=1.0, boundary=boundary)


@pytest.fixture(scope="module")
def wan22(load_tiny):
    model = load_tiny("tiny-wan22-t2v")
    return model, encode_text(model, "a cat dance video"), encode_text(model, "blurry"), empty_latent(model, 32, 32, 5)


def _record_forwards(model):
    """Hooks on every denoiser: a list of (component name, timestep) per forward call."""
    calls, handles = [], []
    for name, module in model.components.items():
        hook = lambda mod, args, kwargs, name=name: calls.append((name, float(kwargs["timestep"].flatten()[0])))
        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return calls, handles


@pytest.mark.slow
@pytest.mark.parametrize("boundary", [None, 0.7])
def test_wan22_steps_at_or_above_the_boundary_run_on_the_high_noise_expert(wan22, boundary):
    model, pos, neg, latent = wan22
    calls, handles = _record_forwards(model)
    try:
        denoise(model, pos, neg, latent, _schedule(cfg=1.0, boundary=boundary), seed=0)
    finally:
        for h in handles:
            h.remove()
    cut = boundary if boundary is not None else model.model_index["boundary_ratio"]
    expected = [("transformer" if s * 1000 >= cut * 1000 else "transformer_2", s * 1000) for s in SIGMAS[:-1]]
    assert [name for name, _ in calls] == [name for name, _ in expected]
    assert [t for _, t in calls] == pytest.approx([t for _, t in expected])
    assert {name for name, _ in calls} == {"transformer", "transformer_2"}


@pytest.mark.slow
@pytest.mark.parametrize("cfg, passes", [(1.0, 1), (5.0, 2), ((5.0, 1.0), None)])
def test_cfg_one_is_a_single_forward_per_step(wan22, cfg, passes):
    model, pos, neg, latent = wan22
    calls, handles = _record_forwards(model)
    try:
        denoise(model, pos, neg, latent, _schedule(cfg=cfg), seed=0)
    finally:
        for h in handles:
            h.remove()
    per_step = {}
    for name, t in calls:
        per_step.setdefault(t, []).append(name)
    assert len(per_step) == len(SIGMAS) - 1
    for names in per_step.values():
        if passes is None:  # per-expert guidance pair: 5 on the high-noise expert, 1 on the low-noise one
            assert len(names) == (2 if names[0] == "transformer" else 1)
        else:
            assert len(names) == passes


@pytest.mark.slow
def test_same_seed_same_latents_other_seed_differs(wan22):
    model, pos, neg, latent = wan22
    a = denoise(model, pos, neg, latent, _schedule(), seed=7).samples
    b = denoise(model, pos, neg, latent, _schedule(), seed=7).samples
    c = denoise(model, pos, neg, latent, _schedule(), seed=8).samples
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    assert a.shape == latent.samples.shape and torch.isfinite(a).all()
    assert torch.count_nonzero(latent.samples) == 0, "the input latent must not be modified"


def test_interrupt_between_steps_raises_and_reports_progress(wan22):
    model, pos, neg, latent = wan22
    progress, checks = [], []

    def check_interrupt():
        checks.append(len(progress))
        if len(progress) == 2:
            raise InterruptedByUser()

    with pytest.raises(InterruptedByUser):
        denoise(model, pos, neg, latent, _schedule(), seed=0,
                on_step=lambda done, total: progress.append((done, total)), check_interrupt=check_interrupt)
    assert progress == [(1, len(SIGMAS) - 1), (2, len(SIGMAS) - 1)]
    assert checks == [0, 1, 2]


def _use_exact_sigmas(pipe, sigmas):
    """WanPipeline has no ``sigmas`` argument: feed its FlowMatchEuler (shift 1) the non-terminal points."""
    scheduler = pipe.scheduler
    original = type(scheduler).set_timesteps

    def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
        return original(self, sigmas=np.asarray(sigmas[:-1], dtype=np.float64), device=device)

    scheduler.set_timesteps = set_timesteps.__get__(scheduler)


@pytest.mark.slow
def test_wan22_matches_the_diffusers_pipeline_on_the_same_schedule(wan22, tiny_models_root):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    model, pos, neg, latent = wan22
    sigmas = shifted_sigmas(4, 5.0)
    ours = denoise(model, pos, neg, latent, _schedule(sigmas, cfg=5.0), seed=3)
    pipe = WanPipeline(**{**model.pipeline.components, "scheduler": FlowMatchEulerDiscreteScheduler(shift=1.0)},
                       boundary_ratio=model.model_index["boundary_ratio"])
    pipe.set_progress_bar_config(disable=True)
    _use_exact_sigmas(pipe, sigmas)
    reference = pipe(prompt="a cat dance video", negative_prompt="blurry", height=32, width=32, num_frames=5,
                     num_inference_steps=4, guidance_scale=5.0, latents=initial_noise(latent.samples.shape, 3),
                     output_type="latent").frames
    assert torch.allclose(ours.samples, reference, atol=1e-5, rtol=1e-4)
    frames = decode(model, ours)
    pipe_frames = pipe(prompt="a cat dance video", negative_prompt="blurry", height=32, width=32, num_frames=5,
                       num_inference_steps=4, guidance_scale=5.0, latents=initial_noise(latent.samples.shape, 3),
                       output_type="pt").frames[0]  # [F, C, H, W] in 0..1
    assert torch.allclose(frames, pipe_frames.permute(0, 2, 3, 1), atol=1e-4)


@pytest.mark.slow
def test_qwen_image_matches_the_diffusers_pipeline_and_decodes_to_an_image(load_tiny):
    model = load_tiny("tiny-qwen-image")
    pos, neg = encode_text(model, "a red car"), encode_text(model, "blurry")
    latent = empty_latent(model, 32, 32)
    sigmas = (1.0, 0.7, 0.4, 0.15, 0.0)
    ours = denoise(model, pos, neg, latent, _schedule(sigmas, cfg=4.0), seed=5)
    noise = initial_noise(latent.samples.shape, 5)
    reference = model.pipeline(prompt="a red car", negative_prompt="blurry", true_cfg_scale=4.0, height=32, width=32,
                               sigmas=list(sigmas[:-1]), num_inference_steps=4, latents=pack_qwen_latents(noise),
                               output_type="latent").images
    assert torch.allclose(pack_qwen_latents(ours.samples), reference, atol=1e-5, rtol=1e-4)
    assert torch.equal(unpack_qwen_latents(pack_qwen_latents(noise), 8, 8), noise)
    image = decode(model, ours)
    assert image.shape == (1, 32, 32, 3) and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0 and float(image.std()) > 0


def test_wan_decode_is_a_comfyui_image_batch_of_frames(wan22):
    model, pos, neg, latent = wan22
    frames = decode(model, denoise(model, pos, neg, latent, _schedule(), seed=0))
    assert frames.shape == (5, 32, 32, 3) and frames.dtype == torch.float32
    assert 0.0 <= float(frames.min()) and float(frames.max()) <= 1.0


def test_latent_geometry_errors_name_the_field(wan22):
    model = wan22[0]
    with pytest.raises(ValueError, match="width must be a positive multiple of 16"):
        empty_latent(model, 40, 32, 5)
    with pytest.raises(ValueError, match="frames must be 4"):
        empty_latent(model, 32, 32, 6)
    assert empty_latent(model, 64, 32, 9, batch=2).samples.shape == (2, 16, 3, 4, 8)
