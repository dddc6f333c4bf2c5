"""MiniMax-H3 ref2va reference images: parity of the conditioning with diffusers' MiniMax-H3 pipeline steps on the
tiny model, different references give different outputs, limits and wrong combinations are refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch.contract_discovery import ResolvedSchedule
from lorabind.loaders.errors import LoraBindError
from lorabind.loaders.families.minimax_h3 import FAMILY, references
from lorabind.loaders.families.minimax_h3 import pipeline as S

SCHEDULE = ResolvedSchedule(sigmas=shifted_sigmas(3, 12.0), audio_sigmas=shifted_sigmas(3, 3.0), steps=3, cfg=1.0,
                            shift=12.0, task="ref2va")
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def picture(height, width, seed):
    return torch.rand(1, height, width, 3, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def prompt(mm_models):
    return S.encode_prompt(mm_models["plain"], "a dog runs in the city")


def first_forward(model, *args):
    """The kwargs of the first transformer_ref forward of one denoise run, and the run's output."""
    seen = []
    hook = model.components["transformer_ref"].register_forward_pre_hook(
        lambda module, a, kwargs: seen.append({k: v.clone() if torch.is_tensor(v) else v for k, v in kwargs.items()}),
        with_kwargs=True)
    try:
        out = FAMILY.sampling.denoise(model, *args)
    finally:
        hook.remove()
    return seen[0], out


def diffusers_condition(model, image):
    """One image reference as diffusers' setup step normalizes it and its reference encoder encodes it."""
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    processor = VaeImageProcessor(vae_scale_factor=16)  # the setup step's image_processor spec
    pil = processor.numpy_to_pil(image.numpy())[0]
    width, height = pil.size
    multiple, edge = 4 * 2, 32  # tiny: VAE ratio 4 x patch 2; the tiny release's reference_image_short_edge
    scale = edge / min(width, height)
    target_h = max(multiple, round(height * scale / multiple) * multiple)
    target_w = max(multiple, round(width * scale / multiple) * multiple)
    if pil.size != (target_w, target_h):
        pil = processor.resize(pil, height=target_h, width=target_w)
    pixels = torch.from_numpy(np.array(pil)).permute(2, 0, 1)[None, :, None]
    return encode_vae_condition(model.pipeline.vae, pixels, *IMAGENET, 42)


def test_ref2va_conditioning_matches_the_diffusers_pipeline(mm_models, prompt):
    """References encoded, noised (drawn first, one per reference), laid out and timed as diffusers' ref2va steps
    do: ``MiniMaxH3Ref2VASetupStep`` + ``...ReferenceEncoderStep`` + ``MiniMaxH3PrepareConditionLatentsStep`` +
    ``MiniMaxH3Ref2VAPrepareLayoutStep`` + ``MiniMaxH3SetTimestepsStep.build_row_timesteps``."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3Ref2VAPrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
        patchify_video_latents,
    )

    model = mm_models["plain"]
    images = [picture(24, 40, 1)[0], picture(48, 32, 2)[0]]  # one resized (to 32x56), one kept (48x32)
    latent = references.with_references(model, S.empty_latents(model, 32, 32, 1), images[0][None])
    latent = references.with_references(model, latent, images[1][None])  # chained nodes append, in order
    inputs, _ = first_forward(model, prompt, None, latent, SCHEDULE, 7)

    conditions = [diffusers_condition(model, image) for image in images]
    assert [tuple(c.shape) for c in conditions] == [(1, 4, 1, 8, 14), (1, 4, 1, 12, 8)]
    for ours, theirs in zip(latent.extra["references"], conditions):
        assert torch.equal(ours, theirs)

    generator = torch.Generator().manual_seed(7)
    scheduler = MiniMaxH3Scheduler(shift=12.0)
    rows = torch.cat([patchify_video_latents(scheduler.scale_noise(c, 0.999, torch.randn(c.shape, generator=generator)),
                                             (1, 2, 2)).reshape(1, -1, 16) for c in conditions], dim=1)
    n_cond = rows.shape[1]
    assert n_cond == 4 * 7 + 6 * 4
    assert torch.equal(inputs["hidden_states"][:, :n_cond], rows)
    # the generated rows' noise is the NEXT draw of the same generator, as in the pipeline
    assert torch.equal(inputs["hidden_states"][:, n_cond:],
                       patchify_video_latents(torch.randn(latent.samples.shape, generator=generator),
                                              (1, 2, 2)).reshape(1, -1, 16))

    num_text = prompt.embeds.shape[1]
    refs = [MiniMaxH3ImageReference(image=image) for image in images]
    positions, tags, video_idx, audio_idx, text_idx, n_video, n_audio = (
        MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
            torch.ones(num_text, dtype=torch.long), refs, conditions, [], 1, 8, 8,
            latent.extra["audio"].shape[-1], (1, 2, 2), 2, 2, 0))
    assert (n_video, n_audio) == (n_cond, 0)
    assert torch.equal(inputs["position_ids"], positions.float())
    for name, expected in (("token_tags", tags), ("video_indices", video_idx), ("audio_indices", audio_idx),
                           ("text_indices", text_idx)):
        assert torch.equal(inputs[name], expected), name
    t_video, t_audio = 1 - SCHEDULE.sigmas[0], 1 - SCHEDULE.audio_sigmas[0]
    timesteps, indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        video_idx, audio_idx, n_video, 0, num_text, t_video, t_audio, max(t_video, 0.999), 1.0)
    assert torch.equal(inputs["timestep"], timesteps) and torch.equal(inputs["timestep_indices"], indices)


def test_two_different_reference_images_give_two_different_outputs(mm_models, prompt):
    model = mm_models["plain"]
    empty = S.empty_latents(model, 32, 32, 1)
    runs = [FAMILY.sampling.denoise(model, prompt, None, references.with_references(model, empty, picture(32, 32, seed)), SCHEDULE, 3)
            for seed in (1, 2, 1)]
    assert not torch.allclose(runs[0].samples, runs[1].samples, atol=1e-4)
    assert not torch.allclose(runs[0].extra["audio"], runs[1].extra["audio"], atol=1e-4)
    assert torch.equal(runs[0].samples, runs[2].samples)  # same reference, same seed: the same output
    assert "references" in runs[0].extra  # the sampled latent keeps its conditioning (decode ignores it)


def test_reference_limits_and_task_combinations_are_refused_by_name(mm_models):
    model = mm_models["plain"]
    empty = S.empty_latents(model, 32, 32, 1)
    with pytest.raises(LoraBindError, match="at most 9 reference images, got 10"):
        references.with_references(model, references.with_references(model, empty, torch.rand(4, 32, 32, 3)), torch.rand(6, 32, 32, 3))
    with pytest.raises(LoraBindError, match=r"reference image 1 is 160x32; .* within 1:4 and 4:1"):
        references.with_references(model, empty, torch.rand(1, 32, 160, 3))
    anchored = S.with_first_frame(model, empty, torch.rand(1, 32, 32, 3))
    with pytest.raises(LoraBindError, match=r"anchored on a first frame \(task fl2va\); reference images are task "):
        references.with_references(model, anchored, torch.rand(1, 32, 32, 3))
    with pytest.raises(LoraBindError, match=r"carries reference images \(task ref2va\); a first frame is task fl2va"):
        S.with_first_frame(model, references.with_references(model, empty, torch.rand(1, 32, 32, 3)), torch.rand(1, 32, 32, 3))


def test_the_released_short_edge_is_the_default(mm_models):


    assert references.short_edge(mm_models["plain"]) == 32  # the tiny release block's
    assert references.short_edge(SimpleNamespace(model_index={})) == 2048  # the released checkpoint's
