"""One MiniMax-H3 model prediction: the packed sequence, per-row timesteps and the forward one step calls.

We reuse diffusers' layout builder for the packed sequence (the rotary grid must match the released model bit
for bit) and follow its conventions, read from its source:

* one packed sequence ``[text | keyframe rows | audio rows (channel-major stereo) | video rows]``;
* the transformer's timestep is ``t = 1 - sigma`` (0 = noise, 1 = clean), per row; keyframe rows are held at
  ``max(t, 0.999)``.
"""

from __future__ import annotations

from typing import Callable

from ...handles import ConditioningHandle
from .pipeline import AUDIO_CHANNELS, device_of

VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2
KEYFRAME_T = 0.999  # keyframe anchors are held just short of clean, as the released model was trained


def layout(transformer, num_text: int, video, audio, anchors: tuple, references: tuple = ()):
    """The packed sequence's structure: ``[text | keyframes | audio | video]``, or with ``references`` (ref2va
    conditioning latents) ``[text | one block per reference | audio | video]``."""
    import torch
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3Ref2VAPrepareLayoutStep,
    )

    _, _, frames, lat_h, lat_w = video.shape
    text_tags = torch.full((num_text,), TEXT_TAG, dtype=torch.long)
    common = (tuple(transformer.config.patch_size), AUDIO_CHANNELS, AUDIO_TAG, VIDEO_TAG)
    if references:
        from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

        kinds = [MiniMaxH3ImageReference(image=None)] * len(references)  # the builder reads only their kind
        positions, tags, video_idx, audio_idx, text_idx, n_cond, _ = (
            MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
                text_tags, kinds, list(references), [], frames, lat_h, lat_w, audio.shape[-1], *common))
    else:
        positions, tags, video_idx, audio_idx, text_idx, n_cond, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            text_tags, frames, lat_h, lat_w, audio.shape[-1], *common, anchors)
    return {"position_ids": positions.float(), "token_tags": tags, "video_indices": video_idx,
            "audio_indices": audio_idx, "text_indices": text_idx, "n_cond": n_cond}


def pack_video(latents, patch):
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    rows = patchify_video_latents(latents, tuple(patch))
    return rows.reshape(latents.shape[0], -1, rows.shape[-1])


def unpack_video(rows, shape, patch):
    b, c, f, h, w = shape
    pt, ph, pw = patch
    grid = rows.reshape(b, f // pt, h // ph, w // pw, c, pt, ph, pw)
    return grid.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(b, c, f, h, w)


def _row_timesteps(layout, num_text: int, t_video: float, t_audio: float):
    import torch

    length = num_text + layout["video_indices"].numel() + layout["audio_indices"].numel()
    row_t = torch.full((length,), t_video, dtype=torch.float32)
    row_t[layout["video_indices"][: layout["n_cond"]]] = max(t_video, KEYFRAME_T)
    row_t[layout["audio_indices"]] = t_audio
    return torch.unique(row_t, sorted=True, return_inverse=True)


def velocity(forward: Callable, transformer, cond: ConditioningHandle, layout, video_rows, audio_rows, t_video,
             t_audio):
    """One ``forward(**inputs)`` on the transformer's device; velocities come back as float32 on the CPU."""
    import torch

    device = device_of(transformer)
    timesteps, indices = _row_timesteps(layout, cond.embeds.shape[1], t_video, t_audio)
    structure = {k: layout[k].to(device) for k in
                 ("token_tags", "position_ids", "video_indices", "audio_indices", "text_indices")}
    with torch.no_grad():
        video_v, audio_v = forward(
            hidden_states=video_rows.to(device), audio_hidden_states=audio_rows.to(device),
            encoder_hidden_states=cond.embeds.to(device).expand(video_rows.shape[0], -1, -1),
            timestep=timesteps.to(device), timestep_indices=indices.to(device), return_dict=False, **structure,
        )
    return video_v.float().cpu(), audio_v.float().cpu()
