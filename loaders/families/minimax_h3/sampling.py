"""MiniMax-H3 sampling: Euler over two EXPLICIT schedules (video and audio), the task picking the DiT partition.

Why our own loop instead of ``MiniMaxH3ModularPipeline``: its timestep block hands both schedulers only a
step count (``linspace`` + shift), and the pipeline owns the adapter state; a contract here is an EXPLICIT pair
of sigma lists (video and audio, e.g. a checkpoint-pinned ``base_schedule`` shifted by 12 and 3) that must be
followed exactly, with the LoRA state bound by our engine. The velocity is data-ward: ``x0 = x + sigma * v``,
and the Euler step is ``x' = x + (sigma - sigma_next) * v`` (the shared ``loaders.generation.sampling.euler`` steps the
other way and over one schedule, so this family keeps its own loop).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

from ...distributed.cfg_parallel import guidance_passes
from ...errors import LoraBindError
from ...generation.batch_rules import NoBatching
from ...handles import LatentHandle
from .contracts import DEFAULT_TASK, FAMILY_ID, PARTITION_BY_TASK
from .pipeline import part
from .prediction import layout, pack_video, unpack_video, velocity
from .references import noised_rows

# Why MiniMax-H3 requests do not share a forward: its packed sequence gives the whole call one table of distinct
# timesteps (``timestep`` + ``timestep_indices`` over the sequence's rows) and one layout (token tags, rotary
# positions, the rows of each modality), so two requests at different sigmas or with other prompt lengths cannot
# be stacked without rebuilding what diffusers' layout builder makes; the step engine runs each of its forwards
# alone, between the other requests' batches.
NOT_BATCHED = NoBatching("MiniMax-H3 runs one request per forward: its packed text/audio/video sequence carries one "
                         "timestep table and one layout for the whole call, so requests at other sigmas or prompt "
                         "lengths cannot share it")


def check_inputs(model, positive, negative, latent: LatentHandle, schedule) -> None:
    """Refuse a request this loop cannot run, naming the input; cheap and weight-free, so a sampler can call it
    before binding (``denoise`` calls it again for library callers)."""
    if "audio" not in latent.extra:
        raise LoraBindError(f"{model.name}: the latent carries no MiniMax-H3 audio latents; make it with this model")
    audio_sigmas = schedule.audio_sigmas or schedule.sigmas
    if len(schedule.sigmas) != len(audio_sigmas):
        raise LoraBindError(
            f"{model.name}: video and audio schedules differ in length ({list(schedule.sigmas)} vs "
            f"{list(audio_sigmas)})"
        )
    if negative is None and float(schedule.cfg) != 1.0:
        raise LoraBindError(f"{model.name}: cfg={float(schedule.cfg):g} needs a negative conditioning")
    _check_task(model, schedule.task or DEFAULT_TASK, latent)


def _check_task(model, task: str, latent: LatentHandle) -> None:
    anchored = latent.extra.get("keyframes") is not None
    referenced = bool(latent.extra.get("references"))
    if task == "ref2va" and not referenced:
        raise LoraBindError(
            f"{model.name}: task ref2va needs reference images (reference_images on the MiniMax-H3 Reference Images "
            f"node); without them the run would be text-only"
        )
    if task != "ref2va" and referenced:
        raise LoraBindError(
            f"{model.name}: the latent carries reference images, which is task ref2va, but the schedule was resolved "
            f"for {task}; request task=ref2va (e.g. on the MiniMax-H3 schedule node)"
        )
    if task == "fl2va" and not anchored:
        raise LoraBindError(
            f"{model.name}: task fl2va needs a first-frame keyframe in the latent (MiniMax-H3 First Frame node)"
        )
    if task == "t2va" and anchored:
        raise LoraBindError(
            f"{model.name}: the latent is anchored on a first frame, which is task fl2va, but the schedule was "
            f"resolved for t2va; request task=fl2va (e.g. on the MiniMax-H3 schedule node)"
        )


def denoise(forward: Callable, model, positive, negative, latent: LatentHandle, schedule, seed: int, *,
            on_step: Optional[Callable[[int, int], None]] = None, on_latent: Optional[Callable] = None,
            check_interrupt: Optional[Callable[[], None]] = None) -> LatentHandle:
    """Euler over the EXPLICIT ``schedule.sigmas`` (video) and ``schedule.audio_sigmas`` (audio), one forward per
    step (two with cfg != 1 and a negative prompt); T2VA/FL2VA on ``transformer``, Ref2VA on ``transformer_ref``
    (its reference rows noised first, from the same generator, as diffusers' pipeline draws them).
    ``forward(model, partition, **inputs)`` is the family's one denoiser forward; ``on_latent`` sees each step's
    clean video estimate ``x + σ·v`` (this velocity points data-ward)."""
    import torch

    check_inputs(model, positive, negative, latent, schedule)
    task = schedule.task or DEFAULT_TASK
    partition = PARTITION_BY_TASK[task]
    transformer = part(model, partition)

    def call(**inputs):
        return forward(model, partition, **inputs)

    sigmas, audio_sigmas = list(schedule.sigmas), list(schedule.audio_sigmas or schedule.sigmas)
    patch = transformer.config.patch_size
    generator = torch.Generator("cpu").manual_seed(int(seed))  # CPU noise: the same result on every device
    references = tuple(latent.extra.get("references", ()))
    ref_rows = noised_rows(references, generator, patch, latent.samples.shape[0]) if references else None
    video_shape, audio_start = latent.samples.shape, latent.extra["audio"].float()
    video = sigmas[0] * torch.randn(video_shape, generator=generator) + (1 - sigmas[0]) * latent.samples.float()
    audio = audio_sigmas[0] * torch.randn(audio_start.shape, generator=generator) + (1 - audio_sigmas[0]) * audio_start
    batch, channels, audio_dim, audio_len = audio.shape
    keyframes = latent.extra.get("keyframes")
    anchors = tuple(latent.extra.get("keyframe_anchors", ())) if keyframes is not None else ()
    cond_rows = pack_video(keyframes.float(), patch) if keyframes is not None else ref_rows
    conds = [positive] + ([negative] if negative is not None and float(schedule.cfg) != 1.0 else [])
    layouts = [layout(transformer, c.embeds.shape[1], video, audio, anchors, references) for c in conds]
    n_cond = layouts[0]["n_cond"]
    total = len(sigmas) - 1
    for i in range(total):
        if check_interrupt is not None:
            check_interrupt()
        video_rows = pack_video(video, patch)
        if cond_rows is not None:
            video_rows = torch.cat([cond_rows, video_rows], dim=1)
        audio_rows = audio.permute(0, 1, 3, 2).reshape(batch, channels * audio_len, audio_dim)  # channel-major
        step_inputs = (video_rows, audio_rows, 1 - sigmas[i], 1 - audio_sigmas[i])
        outs = guidance_passes(partial(_guidance_pass, call, transformer, conds, layouts, step_inputs), len(conds))
        video_v, audio_v = outs[0]
        if len(outs) == 2:  # classifier-free guidance on both modalities
            video_v = outs[1][0] + schedule.cfg * (video_v - outs[1][0])
            audio_v = outs[1][1] + schedule.cfg * (audio_v - outs[1][1])
        video_v = unpack_video(video_v[:, n_cond:], video_shape, patch)
        audio_v = audio_v.reshape(batch, channels, audio_len, audio_dim).permute(0, 1, 3, 2)
        if on_latent is not None:
            on_latent(i + 1, total, video + sigmas[i] * video_v)
        video = video + (sigmas[i] - sigmas[i + 1]) * video_v
        audio = audio + (audio_sigmas[i] - audio_sigmas[i + 1]) * audio_v
        if on_step is not None:
            on_step(i + 1, total)
    return LatentHandle(samples=video, family=FAMILY_ID, kind="video+audio", extra={**latent.extra, "audio": audio})


def _guidance_pass(call, transformer, conds, layouts, step_inputs, index: int):
    """Pass ``index`` of a step (0 conditional, 1 unconditional): (video, audio) velocities."""
    return velocity(call, transformer, conds[index], layouts[index], *step_inputs)
