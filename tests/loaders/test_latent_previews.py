"""Live previews at the engine's step point (issue 56): every family's loop hands ``on_latent`` each step's
clean-latent estimate in the latent's own shape, changes nothing it returns, and each family's latent->RGB maps
turn it into the first frame's colours."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lorabind.loaders.contract_types import ResolvedSchedule
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch import generation_steps as generation
from lorabind.loaders.families import family_by_id
from lorabind.loaders.generation.latent_preview import latent_to_rgb
from lorabind.loaders.generation.latent_rgb import LatentRGB, spread_over_rgb
from lorabind.loaders.generation.sampling import euler
from lorabind.loaders.generation.schedulers import step_over


def test_latent_to_rgb_is_the_linear_map_of_the_first_sample_and_frame():
    rgb = LatentRGB(factors=((1.0, 0.0, 0.5), (0.0, 1.0, -0.5)), bias=(0.1, -0.1, 0.0))
    video = torch.zeros(2, 2, 3, 4, 5)
    video[0, 0, 0], video[0, 1, 0] = 0.5, -0.25  # sample 0, frame 0: what a preview shows
    video[1], video[0, :, 1:] = 9.0, -9.0  # the other sample and frames must not show
    pixels = latent_to_rgb(video, rgb)
    assert pixels.shape == (4, 5, 3) and pixels.dtype == np.uint8
    # red 0.5 + 0.1, green -0.25 - 0.1, blue 0.25 + 0.125, each -1..1 scaled to 0..255
    expected = [round((value + 1.0) * 127.5) for value in (0.6, -0.35, 0.375)]
    assert np.abs(pixels.astype(int) - np.array(expected)).max() <= 1
    image = latent_to_rgb(torch.full((1, 2, 4, 4), 5.0), rgb)  # an image latent [B, C, H, W], clamped
    assert image.shape == (4, 4, 3) and (image[..., :2] == 255).all()


def test_an_unfitted_latent_spreads_its_channels_over_the_three_colours():
    rgb = spread_over_rgb(4)  # channels 0 and 3 share red
    assert rgb.factors == ((0.5, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.0, 0.0))
    assert rgb.bias == (0.0, 0.0, 0.0) and rgb.comfy_format is None
    assert spread_over_rgb(1).factors == ((1.0, 0.0, 0.0),)


@pytest.mark.parametrize("family, channels, comfy_format", [
    ("wan", 16, "Wan21"), ("wan", 48, "Wan22"), ("qwen_image", 16, "Wan21"), ("minimax_h3", 24, "MiniMaxH3Video"),
])
def test_each_family_declares_the_maps_of_its_vaes(family, channels, comfy_format):
    rgb = family_by_id(family).sampling.latent_rgb(channels)
    assert rgb.channels == channels and rgb.comfy_format == comfy_format
    assert all(len(row) == 3 for row in rgb.factors) and len(rgb.bias) == 3
    assert family_by_id(family).sampling.latent_rgb(4) == spread_over_rgb(4)  # a tiny model's VAE


def _linear_velocity(i, x, sigma):
    return 0.5 * x + sigma  # any velocity: the estimate is checked against its definition


@pytest.mark.parametrize("rule", ["euler", "unipc"])
def test_the_step_loops_hand_over_x_minus_sigma_v_and_sample_as_without_it(rule):
    sigmas = shifted_sigmas(4, 5.0)
    start = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(0))
    inputs, calls = [], []

    def velocity(i, x, sigma):
        inputs.append((x.clone(), _linear_velocity(i, x, sigma)))
        return _linear_velocity(i, x, sigma)

    with_previews = step_over(start, sigmas, velocity, rule, on_latent=lambda d, t, x0: calls.append((d, t, x0)),
                              on_step=lambda d, t: calls.append((d, t)))
    assert torch.equal(with_previews, step_over(start, sigmas, _linear_velocity, rule))
    assert [c[:2] for c in calls] == [(d, 4) for d in (1, 1, 2, 2, 3, 3, 4, 4)]  # on_latent, then on_step
    points = [min(s, 1.0 - 1e-6) for s in sigmas] if rule == "unipc" else sigmas  # diffusers' first-sigma guard
    for (x, v), point, (_, _, estimate) in zip(inputs, points, calls[::2]):
        assert torch.allclose(estimate, x - point * v)
    if rule == "euler":  # the last step ends at sigma 0: its estimate is the result
        assert torch.allclose(calls[-2][2], with_previews)


def test_euler_computes_nothing_for_previews_without_a_callback(monkeypatch):
    from lorabind.loaders.generation import sampling

    monkeypatch.setattr(sampling, "denoised", lambda *a: pytest.fail("estimate computed without on_latent"))
    euler(torch.zeros(1, 2), shifted_sigmas(2, 1.0), lambda i, x, s: x)


@pytest.mark.parametrize("name", ["tiny-wan22-t2v", "tiny-qwen-image"])
def test_a_family_loop_previews_in_the_latent_shape_and_returns_the_same_samples(tiny_sampler_inputs, name):
    handle, positive, negative, latent = tiny_sampler_inputs[name]
    schedule = ResolvedSchedule(sigmas=shifted_sigmas(3, 5.0), steps=3, cfg=1.0, shift=5.0)
    seen = []
    previewed = generation.denoise(handle.model, positive, negative, latent, schedule, 7,
                                   on_latent=lambda done, total, x0: seen.append((done, total, x0)))
    plain = generation.denoise(handle.model, positive, negative, latent, schedule, 7)
    assert torch.equal(previewed.samples, plain.samples)
    assert [(done, total) for done, total, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert all(x0.shape == latent.samples.shape for _, _, x0 in seen)  # Qwen-Image's 2x2 packing undone
    assert torch.allclose(seen[-1][2], previewed.samples, atol=1e-5)  # Euler's last step lands on its estimate
    rgb = generation.latent_rgb(handle.model, latent)
    assert rgb.channels == latent.samples.shape[1]
    assert latent_to_rgb(seen[0][2], rgb).shape == (*latent.samples.shape[-2:], 3)


def test_the_minimax_loop_previews_its_video_estimate(mm_models):
    from lorabind.loaders.families.minimax_h3 import FAMILY, pipeline

    model = mm_models["plain"]
    positive = pipeline.encode_prompt(model, "a dog runs")
    latent = pipeline.empty_latents(model, 32, 32, 2)
    schedule = ResolvedSchedule(sigmas=shifted_sigmas(2, 12.0), audio_sigmas=shifted_sigmas(2, 3.0), steps=2,
                                cfg=1.0, shift=12.0, task="t2va")
    seen = []
    previewed = FAMILY.sampling.denoise(model, positive, None, latent, schedule, 3,
                                        on_latent=lambda done, total, x0: seen.append((done, total, x0)))
    assert torch.equal(previewed.samples, FAMILY.sampling.denoise(model, positive, None, latent, schedule, 3).samples)
    assert [(d, t) for d, t, _ in seen] == [(1, 2), (2, 2)]
    assert seen[0][2].shape == latent.samples.shape
    assert torch.allclose(seen[-1][2], previewed.samples, atol=1e-5)  # the last step ends at sigma 0
