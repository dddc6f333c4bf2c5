"""MiniMax-H3 pipeline pieces on a ``LoadedModel``: loading (a modular pipeline: component by component), prompt
encoding, video + audio latents, the first-frame anchor, and decoding (video and soundtrack).

Needs diffusers with MiniMax-H3 (0.42+); imported lazily so older diffusers still import the package.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Optional

from ...errors import LoraBindError, ModelLoadError
from ...generation.sampling import device_and_dtype
from ...handles import ConditioningHandle, LatentHandle
from .contracts import FAMILY_ID

FPS = 24  # MiniMax-H3 generates at a fixed 24 fps
AUDIO_LATENTS_PER_SECOND = 40
AUDIO_CHANNELS = 2  # stereo, packed channel-major; the audio VAE is mono and decodes the channels as a batch
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

    MiniMax-H3 ships as a modular pipeline (no ``DiffusionPipeline`` class to instantiate), so the family loads
    it this way; a single ``dtype`` applies to the DiTs only (the VAEs stay float32 as released), a
    ``{component: dtype}`` (``dtype=auto``: each as stored) to the components it names.
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
        component_dtype = dtype.get(name) if isinstance(dtype, dict) else (
            dtype if name.startswith("transformer") else None)
        kwargs = {"torch_dtype": component_dtype} if component_dtype is not None else {}
        if _is_weights_module(cls):  # safetensors only; tokenizers and processors take no such option
            kwargs["use_safetensors"] = True
        components[name] = cls.from_pretrained(str(folder / name), local_files_only=True, **kwargs)
        if hasattr(components[name], "eval"):
            components[name].eval()
    return MiniMaxH3Components(components)


def _is_weights_module(cls) -> bool:
    import torch

    return isinstance(cls, type) and issubclass(cls, torch.nn.Module)


def part(model, name: str):
    module = model.components.get(name) if name.startswith("transformer") else None
    if module is None:
        module = getattr(model.pipeline, name, None)
    if module is None:
        raise ModelLoadError(f"{model.name}: MiniMax-H3 component {name!r} is missing")
    return module


def device_of(module):
    return device_and_dtype(module)[0]


def encode_prompt(model, text: str) -> ConditioningHandle:
    """The text encoder's last hidden state for ``text`` ([1, tokens, text_dim])."""
    import torch

    tokenizer, encoder = part(model, "tokenizer"), part(model, "text_encoder")
    ids = tokenizer(text or "", return_tensors="pt").input_ids
    if ids.shape[1] == 0:  # an empty prompt still needs one text row in the packed sequence
        ids = torch.tensor([[tokenizer.pad_token_id]])
    with torch.no_grad():
        embeds = encoder(input_ids=ids.to(device_of(encoder))).last_hidden_state.float().cpu()
    return ConditioningHandle(embeds=embeds, family=FAMILY_ID, text=text)


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
        latent = vae.encode(pixels.to(device_of(vae))).latent_dist.mode()[:, :, :1].float().cpu()
    lat_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    lat_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (latent - lat_mean) / lat_std


def empty_latents(model, width: int, height: int, frames: int, audio_seconds: Optional[float] = None,
                  batch: int = 1) -> LatentHandle:
    """Zero video + audio latents for a request (the soundtrack lasts as long as the video unless told)."""
    import torch

    vae, transformer = part(model, "vae"), part(model, "transformer")
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
    return LatentHandle(samples=video, family=FAMILY_ID, kind="video+audio",
                        extra={"audio": audio, "fps": FPS, "frames": int(frames)})


def with_first_frame(model, latent: LatentHandle, image) -> LatentHandle:
    """The latent with ``image`` (IMAGE [1, H, W, C]) as its FL2VA first-frame keyframe anchor."""
    if latent.extra.get("references"):
        raise LoraBindError(f"{model.name}: the latent carries reference images (task ref2va); a first frame is "
                            "task fl2va: start from an empty latent")
    vae = part(model, "vae")
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
    """"fl2va" for a latent anchored on a first frame, "ref2va" for one with reference images, else None (for
    ``SamplingRequest.task``)."""
    if latent.extra.get("references"):
        return "ref2va"
    return "fl2va" if latent.extra.get("keyframes") is not None else None


def decode(model, latent: LatentHandle):
    """Video latents → IMAGE [frames, H, W, 3] in 0..1 (batch items' frames concatenated)."""
    import torch

    vae = part(model, "vae")
    z = latent.samples.float()
    z = z * torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1) + torch.tensor(
        vae.config.latents_mean).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        # the VAE works in ImageNet-normalized pixel space (see AutoencoderKLMiniMaxH3), not [-1, 1]
        pixels = vae.decode(z.to(device_of(vae))).sample.float().cpu()
    pixels = pixels * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1) + torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
    return pixels.clamp(0, 1).permute(0, 2, 3, 4, 1).reshape(-1, pixels.shape[3], pixels.shape[4], 3)


def decode_audio(model, latent: LatentHandle) -> dict:
    """Audio latents → ComfyUI AUDIO ``{"waveform": [B, 2, samples], "sample_rate": int}``."""
    import torch

    audio_vae = part(model, "audio_vae")
    z = latent.extra["audio"].float()
    batch, channels = z.shape[:2]
    z = z.reshape(batch * channels, z.shape[2], z.shape[3])
    z = z * torch.tensor(audio_vae.config.latents_std).view(1, -1, 1) + torch.tensor(
        audio_vae.config.latents_mean).view(1, -1, 1)
    with torch.no_grad():
        wave = audio_vae.decode(z.to(device_of(audio_vae))).sample.float().cpu()  # [B * 2, 1, samples] in -1..1
    return {"waveform": wave.reshape(batch, channels, -1), "sample_rate": int(audio_vae.config.sampling_rate)}
