"""MiniMax-H3 ref2va image references: normalized, encoded and noised the way diffusers' MiniMax-H3 pipeline does.

Why these exact steps (read from diffusers' ``MiniMaxH3Ref2VASetupStep``, ``MiniMaxH3Ref2VAReferenceEncoderStep``
and ``MiniMaxH3PrepareConditionLatentsStep``): the released ``transformer_ref`` was trained on references prepared
this way, so each one matters for what it sees:

* an image reference is resized (LANCZOS, as the released model was conditioned on) to a short edge of its own,
  2048 for the released checkpoint, both sides rounded to the canvas multiple, whatever size the video is;
* it is encoded by the video VAE with the posterior SAMPLED under its own fixed seed (42), rounded to float16,
  then normalized by the VAE's latent mean/std;
* at sampling time each reference draws its noise from the request's generator BEFORE the generated rows do, one
  draw per reference in order, and is mixed to ``t = 0.999`` (held there on every step).

The tiny models' text encoder reads text only, so the prompt presentation's "<Picture i>" vision blocks (a
Qwen3-VL feature) are not part of the conditioning here; the references reach the denoiser as packed rows.
"""

from __future__ import annotations

from ...errors import LoraBindError
from ...handles import LatentHandle
from .contracts import release_info
from .pipeline import IMAGENET_MEAN, IMAGENET_STD, device_of, part
from .prediction import pack_video

MAX_IMAGE_REFERENCES = 9  # diffusers' MiniMaxH3Ref2VASetupStep max_images, the released checkpoint's limit
RELEASED_SHORT_EDGE = 2048  # the released checkpoint's reference_image_short_edge
ENCODE_SEED = 42  # the pipeline's keyframe_encode_seed: the same image always encodes to the same anchor
NOISE_AUG_T = 0.999  # the pipeline's keyframe_noise_aug: references are held just short of clean
MAX_ASPECT = 4  # references within 1:4 and 4:1, as the pipeline checks


def short_edge(model) -> int:
    """The short edge references are encoded at: the release block's ``reference_image_short_edge`` (the tiny
    models set a small one), else the released checkpoint's 2048."""
    return int(release_info(model.model_index).get("reference_image_short_edge", RELEASED_SHORT_EDGE))


def canvas_multiple(model) -> int:
    """What both sides of an encoded reference round to: VAE ratio x patch width (32 for the released model)."""
    return part(model, "vae").spatial_compression_ratio * part(model, "transformer_ref").config.patch_size[2]


def normalized_pixels(image, edge: int, multiple: int, label: str):
    """One IMAGE [H, W, C] 0..1 → uint8 pixels [1, 3, 1, h, w] at the reference geometry (PIL LANCZOS)."""
    import numpy as np
    import torch
    from PIL import Image

    array = (image[..., :3].float().clamp(0, 1) * 255.0).round().to(torch.uint8).cpu().numpy()
    height, width = array.shape[:2]
    if width > MAX_ASPECT * height or height > MAX_ASPECT * width:
        raise LoraBindError(f"{label} is {width}x{height}; MiniMax-H3 references must be within 1:4 and 4:1")
    scale = edge / min(width, height)
    target = (max(multiple, round(width * scale / multiple) * multiple),
              max(multiple, round(height * scale / multiple) * multiple))
    picture = Image.fromarray(array)
    if picture.size != target:
        picture = picture.resize(target, Image.Resampling.LANCZOS)
    return torch.from_numpy(np.array(picture)).permute(2, 0, 1)[None, :, None]


def encode(vae, pixels):
    """uint8 pixels [1, 3, 1, h, w] → normalized conditioning latent [1, C, 1, h', w'] (float32, CPU)."""
    import torch

    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1)
    normalized = (pixels.float() / 255.0 - mean) / std
    with torch.no_grad():
        posterior = vae.encode(normalized.to(device_of(vae)), return_dict=False)[0]
        latent = posterior.sample(generator=torch.Generator().manual_seed(ENCODE_SEED))
    latent = latent.to(torch.float16).float().cpu()
    lat_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    lat_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (latent - lat_mean) / lat_std


def with_references(model, latent: LatentHandle, images) -> LatentHandle:
    """The latent with each image of ``images`` (IMAGE [B, H, W, C]) appended to its ref2va references."""
    if latent.extra.get("keyframes") is not None:
        raise LoraBindError(f"{model.name}: the latent is anchored on a first frame (task fl2va); reference images "
                            "are task ref2va: start from an empty latent")
    existing = tuple(latent.extra.get("references", ()))
    if len(existing) + images.shape[0] > MAX_IMAGE_REFERENCES:
        raise LoraBindError(f"{model.name}: MiniMax-H3 takes at most {MAX_IMAGE_REFERENCES} reference images, got "
                            f"{len(existing) + images.shape[0]}")
    vae, edge, multiple = part(model, "vae"), short_edge(model), canvas_multiple(model)
    encoded = tuple(encode(vae, normalized_pixels(image, edge, multiple, f"reference image {len(existing) + i + 1}"))
                    for i, image in enumerate(images))
    return LatentHandle(samples=latent.samples, family=latent.family, kind=latent.kind,
                        extra={**latent.extra, "references": existing + encoded})


def noised_rows(references, generator, patch, batch: int):
    """The references' packed rows [batch, rows, dim], each mixed with its own draw from ``generator`` to
    ``t = 0.999``; drawn in reference order BEFORE the generated rows' noise, as the pipeline does."""
    import torch


    t = torch.tensor(NOISE_AUG_T)  # float32 like the pipeline's scale_noise, so 1 - t rounds the same way
    rows = []
    for reference in references:
        noise = torch.randn(reference.shape, generator=generator)
        rows.append(pack_video(t * reference + (1.0 - t) * noise, patch))
    return torch.cat(rows, dim=1).expand(batch, -1, -1)
