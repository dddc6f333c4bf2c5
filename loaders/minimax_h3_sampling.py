"""MiniMax-H3 prompt encoding, latents, denoising (video + audio) and decoding, on a ``LoadedModel``.

Why our own loop instead of ``MiniMaxH3ModularPipeline``: its timestep block hands both schedulers only a
step count (``linspace`` + shift), and the pipeline owns the adapter state; a contract here is an EXPLICIT pair
of sigma lists (video and audio, e.g. a checkpoint-pinned ``base_schedule`` shifted by 12 and 3) that must be
followed exactly, with the LoRA state bound by our engine. We reuse diffusers' layout builder for the packed
sequence (the rotary grid must match the released model bit for bit) and follow its conventions, read from its
source:

* one packed sequence ``[text | keyframe rows | audio rows (channel-major stereo) | video rows]``;
* the transformer's timestep is ``t = 1 - sigma`` (0 = noise, 1 = clean), per row; keyframe rows are held at
  ``max(t, 0.999)``;
* the velocity is data-ward: ``x0 = x + sigma * v``, and the Euler step is ``x' = x + (sigma - sigma_next) * v``.

Needs diffusers with MiniMax-H3 (0.42+); imported lazily so older diffusers still import the package.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable, Optional

from .errors import LoraBindError, ModelLoadError
from .families.minimax_h3_contracts import DEFAULT_TASK, PARTITION_BY_TASK
from .handles import ConditioningHandle, LatentHandle

FAMILY = "minimax_h3"
FPS = 24  # MiniMax-H3 generates at a fixed 24 fps
AUDIO_LATENTS_PER_SECOND = 40
AUDIO_CHANNELS = 2  # stereo, packed channel-major; the audio VAE is mono and decodes the channels as a batch
VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2
KEYFRAME_T = 0.999  # keyframe anchors are held just short of clean, as the released model was trained
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class MiniMaxH3Components:
    """The loaded components as attributes (``transformer``, ``transformer_ref``, ``vae``, ``audio_vae``,
    ``text_encoder``, ``tokenizer``, schedulers): what ``LoadedModel.pipeline`` holds for this family."""

    def __init__(self, components: dict):
        self.components = dict(components)
        for name, module in components.items():
            setattr(self, name, module)


def load_pipeline(path, model_index: dict, *, dtype=None) -> MiniMaxH3Components:
    """Every ``[library, class]`` entry of ``model_index`` (the folder's ``model_index.json``) loaded from its
    subfolder, offline.

    MiniMax-H3 ships as a modular pipeline (no ``DiffusionPipeline`` class to instantiate), so the model store
    calls this instead; ``dtype`` applies to the DiTs only (the VAEs stay float32 as released).
    """
    folder = Path(path)
    components = {}
    for name, entry in model_index.items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2 or entry[0] is None:
            continue
        library, class_name = entry
        try:
            cls = getattr(importlib.import_module(library), class_name)
        except (ImportError, AttributeError) as exc:
            raise ModelLoadError(
                f"{folder.name}: component {name!r} needs {library}.{class_name}, which this install lacks "
                f"(MiniMax-H3 needs diffusers >= 0.42): {exc}"
            ) from None
        if name.endswith("scheduler"):
            components[name] = cls.from_pretrained(str(folder / name))
            continue
        kwargs = {"torch_dtype": dtype} if dtype is not None and name.startswith("transformer") else {}
        if _is_weights_module(cls):  # safetensors only; tokenizers and processors take no such option
            kwargs["use_safetensors"] = True
        components[name] = cls.from_pretrained(str(folder / name), local_files_only=True, **kwargs)
        if hasattr(components[name], "eval"):
            components[name].eval()
    return MiniMaxH3Components(components)


def _is_weights_module(cls) -> bool:
    import torch

    return isinstance(cls, type) and issubclass(cls, torch.nn.Module)


def _part(model, name: str):
    module = model.components.get(name) if name.startswith("transformer") else None
    if module is None:
        module = getattr(model.pipeline, name, None)
    if module is None:
        raise ModelLoadError(f"{model.name}: MiniMax-H3 component {name!r} is missing")
    return module


def _device(module):
    return next(module.parameters()).device


def encode_prompt(model, text: str) -> ConditioningHandle:
    """The text encoder's last hidden state for ``text`` ([1, tokens, text_dim])."""
    import torch

    tokenizer, encoder = _part(model, "tokenizer"), _part(model, "text_encoder")
    ids = tokenizer(text or "", return_tensors="pt").input_ids
    if ids.shape[1] == 0:  # an empty prompt still needs one text row in the packed sequence
        ids = torch.tensor([[tokenizer.pad_token_id]])
    with torch.no_grad():
        embeds = encoder(input_ids=ids.to(_device(encoder))).last_hidden_state.float().cpu()
    return ConditioningHandle(embeds=embeds, family=FAMILY, text=text)


def latent_frame_count(vae, frames: int) -> int:
    """Latent frames the video VAE gives for ``frames`` pixel frames (``17n + 5 → 5n + 2`` for the real VAE)."""
    clip, drop = vae.config.clip_length, vae.config.token_drop
    if clip == 1 and vae.temporal_compression_ratio == 1 and drop == 0:
        return frames  # no temporal compression (tiny models)
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import align_num_frames, video_latent_num_frames

    return video_latent_num_frames(align_num_frames(frames, clip, vae.tokens_chunk_size), clip, vae.tokens_chunk_size)


def _normalize_image(vae, image):
    """IMAGE [B, H, W, C] 0..1 → one normalized latent frame [B, C, 1, h, w] (keyframe conditioning)."""
    import torch

    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1)
    pixels = (image[..., :3].permute(0, 3, 1, 2).unsqueeze(2).float() - mean) / std
    with torch.no_grad():
        latent = vae.encode(pixels.to(_device(vae))).latent_dist.mode()[:, :, :1].float().cpu()
    lat_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    lat_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (latent - lat_mean) / lat_std


def empty_latents(model, width: int, height: int, frames: int, audio_seconds: Optional[float] = None,
                  batch: int = 1) -> LatentHandle:
    """Zero video + audio latents for a request (the soundtrack lasts as long as the video unless told)."""
    import torch

    vae, transformer = _part(model, "vae"), _part(model, "transformer")
    ratio = vae.spatial_compression_ratio
    _, patch_h, patch_w = transformer.config.patch_size
    if width % (ratio * patch_w) or height % (ratio * patch_h):
        raise LoraBindError(
            f"{model.name}: width and height must be multiples of {ratio * patch_w} (VAE ratio x patch), "
            f"got {width}x{height}"
        )
    latent_frames = latent_frame_count(vae, int(frames))
    video = torch.zeros(batch, transformer.config.in_channels, latent_frames, height // ratio, width // ratio)
    seconds = frames / FPS if audio_seconds is None else float(audio_seconds)
    audio_len = max(1, int(round(seconds * AUDIO_LATENTS_PER_SECOND)))
    audio = torch.zeros(batch, AUDIO_CHANNELS, transformer.config.audio_in_channels, audio_len)
    return LatentHandle(samples=video, family=FAMILY, kind="video+audio",
                        extra={"audio": audio, "fps": FPS, "frames": int(frames)})


def with_first_frame(model, latent: LatentHandle, image) -> LatentHandle:
    """The latent with ``image`` (IMAGE [1, H, W, C]) as its FL2VA first-frame keyframe anchor."""
    vae = _part(model, "vae")
    height, width = latent.samples.shape[-2] * vae.spatial_compression_ratio, latent.samples.shape[-1] * (
        vae.spatial_compression_ratio)
    if tuple(image.shape[1:3]) != (height, width):
        raise LoraBindError(
            f"{model.name}: the first frame is {image.shape[2]}x{image.shape[1]} but the latent is for "
            f"{width}x{height}; resize the image first"
        )
    keyframe = _normalize_image(vae, image[:1]).expand(latent.samples.shape[0], -1, -1, -1, -1).clone()
    extra = {**latent.extra, "keyframes": keyframe, "keyframe_anchors": ("first",)}
    return LatentHandle(samples=latent.samples, family=latent.family, kind=latent.kind, extra=extra)


def implied_task(latent: LatentHandle) -> Optional[str]:
    """"fl2va" for a latent anchored on a first frame, else None (for ``SamplingRequest.task``)."""
    return "fl2va" if latent.extra.get("keyframes") is not None else None


def _layout(transformer, num_text: int, video, audio, anchors: tuple):
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    import torch

    _, _, frames, lat_h, lat_w = video.shape
    positions, tags, video_idx, audio_idx, text_idx, n_cond, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.full((num_text,), TEXT_TAG, dtype=torch.long), frames, lat_h, lat_w, audio.shape[-1],
        tuple(transformer.config.patch_size), AUDIO_CHANNELS, AUDIO_TAG, VIDEO_TAG, anchors,
    )
    return {"position_ids": positions.float(), "token_tags": tags, "video_indices": video_idx,
            "audio_indices": audio_idx, "text_indices": text_idx, "n_cond": n_cond}


def _pack_video(latents, patch):
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    rows = patchify_video_latents(latents, tuple(patch))
    return rows.reshape(latents.shape[0], -1, rows.shape[-1])


def _unpack_video(rows, shape, patch):
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


def _velocity(transformer, cond: ConditioningHandle, layout, video_rows, audio_rows, t_video, t_audio):
    """One forward on the transformer's device; velocities come back as float32 on the CPU."""
    import torch

    device = _device(transformer)
    timesteps, indices = _row_timesteps(layout, cond.embeds.shape[1], t_video, t_audio)
    structure = {k: layout[k].to(device) for k in
                 ("token_tags", "position_ids", "video_indices", "audio_indices", "text_indices")}
    with torch.no_grad():
        video_v, audio_v = transformer(
            hidden_states=video_rows.to(device), audio_hidden_states=audio_rows.to(device),
            encoder_hidden_states=cond.embeds.to(device).expand(video_rows.shape[0], -1, -1),
            timestep=timesteps.to(device), timestep_indices=indices.to(device), return_dict=False, **structure,
        )
    return video_v.float().cpu(), audio_v.float().cpu()


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
    if task == "fl2va" and not anchored:
        raise LoraBindError(
            f"{model.name}: task fl2va needs a first-frame keyframe in the latent (MiniMax-H3 First Frame node)"
        )
    if task == "t2va" and anchored:
        raise LoraBindError(
            f"{model.name}: the latent is anchored on a first frame, which is task fl2va, but the schedule was "
            f"resolved for t2va; request task=fl2va (e.g. on the MiniMax-H3 schedule node)"
        )


def denoise(model, positive, negative, latent: LatentHandle, schedule, seed: int, *,
            on_step: Optional[Callable[[int, int], None]] = None,
            check_interrupt: Optional[Callable[[], None]] = None) -> LatentHandle:
    """Euler over the EXPLICIT ``schedule.sigmas`` (video) and ``schedule.audio_sigmas`` (audio), one forward per
    step (two with cfg != 1 and a negative prompt); T2VA/FL2VA on ``transformer``, Ref2VA on ``transformer_ref``."""
    import torch

    check_inputs(model, positive, negative, latent, schedule)
    task = schedule.task or DEFAULT_TASK
    transformer = _part(model, PARTITION_BY_TASK[task])
    sigmas, audio_sigmas = list(schedule.sigmas), list(schedule.audio_sigmas or schedule.sigmas)
    patch = transformer.config.patch_size
    generator = torch.Generator("cpu").manual_seed(int(seed))  # CPU noise: the same result on every device
    video_shape, audio_start = latent.samples.shape, latent.extra["audio"].float()
    video = sigmas[0] * torch.randn(video_shape, generator=generator) + (1 - sigmas[0]) * latent.samples.float()
    audio = audio_sigmas[0] * torch.randn(audio_start.shape, generator=generator) + (1 - audio_sigmas[0]) * audio_start
    batch, channels, audio_dim, audio_len = audio.shape
    keyframes = latent.extra.get("keyframes")
    anchors = tuple(latent.extra.get("keyframe_anchors", ())) if keyframes is not None else ()
    cond_rows = _pack_video(keyframes.float(), patch) if keyframes is not None else None
    conds = [positive] + ([negative] if negative is not None and float(schedule.cfg) != 1.0 else [])
    layouts = [_layout(transformer, c.embeds.shape[1], video, audio, anchors) for c in conds]
    n_cond = layouts[0]["n_cond"]
    total = len(sigmas) - 1
    for i in range(total):
        if check_interrupt is not None:
            check_interrupt()
        video_rows = _pack_video(video, patch)
        if cond_rows is not None:
            video_rows = torch.cat([cond_rows, video_rows], dim=1)
        audio_rows = audio.permute(0, 1, 3, 2).reshape(batch, channels * audio_len, audio_dim)  # channel-major
        outs = [_velocity(transformer, c, lay, video_rows, audio_rows, 1 - sigmas[i], 1 - audio_sigmas[i])
                for c, lay in zip(conds, layouts)]
        video_v, audio_v = outs[0]
        if len(outs) == 2:  # classifier-free guidance on both modalities
            video_v = outs[1][0] + schedule.cfg * (video_v - outs[1][0])
            audio_v = outs[1][1] + schedule.cfg * (audio_v - outs[1][1])
        video_v = _unpack_video(video_v[:, n_cond:], video_shape, patch)
        audio_v = audio_v.reshape(batch, channels, audio_len, audio_dim).permute(0, 1, 3, 2)
        video = video + (sigmas[i] - sigmas[i + 1]) * video_v
        audio = audio + (audio_sigmas[i] - audio_sigmas[i + 1]) * audio_v
        if on_step is not None:
            on_step(i + 1, total)
    return LatentHandle(samples=video, family=FAMILY, kind="video+audio", extra={**latent.extra, "audio": audio})


def decode(model, latent: LatentHandle):
    """Video latents → IMAGE [frames, H, W, 3] in 0..1 (batch items' frames concatenated)."""
    import torch

    vae = _part(model, "vae")
    z = latent.samples.float()
    z = z * torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1) + torch.tensor(
        vae.config.latents_mean).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        # the VAE works in ImageNet-normalized pixel space (see AutoencoderKLMiniMaxH3), not [-1, 1]
        pixels = vae.decode(z.to(_device(vae))).sample.float().cpu()
    pixels = pixels * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1) + torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
    return pixels.clamp(0, 1).permute(0, 2, 3, 4, 1).reshape(-1, pixels.shape[3], pixels.shape[4], 3)


def decode_audio(model, latent: LatentHandle) -> dict:
    """Audio latents → ComfyUI AUDIO ``{"waveform": [B, 2, samples], "sample_rate": int}``."""
    import torch

    audio_vae = _part(model, "audio_vae")
    z = latent.extra["audio"].float()
    batch, channels = z.shape[:2]
    z = z.reshape(batch * channels, z.shape[2], z.shape[3])
    z = z * torch.tensor(audio_vae.config.latents_std).view(1, -1, 1) + torch.tensor(
        audio_vae.config.latents_mean).view(1, -1, 1)
    with torch.no_grad():
        wave = audio_vae.decode(z.to(_device(audio_vae))).sample.float().cpu()  # [B * 2, 1, samples] in -1..1
    return {"waveform": wave.reshape(batch, channels, -1), "sample_rate": int(audio_vae.config.sampling_rate)}
