"""Wan VACE conditioning: a control video, its masks and reference images -> what each VACE forward sees.

A VACE transformer (diffusers ``WanVACETransformer3DModel``) is a text-to-video Wan transformer with a control
branch: ``control_hidden_states`` (96 channels) are embedded by ``vace_patch_embedding`` and run through the
``vace_blocks``, whose hints are added, times ``control_hidden_states_scale``, to the main blocks listed in
``vace_layers``. This module follows diffusers' ``pipeline_wan_vace.py`` (0.42) step for step, so our sampler's
latents equal ``WanVACEPipeline``'s on the same inputs and sigmas:

- the control video (grey where absent: 0 in -1..1) is split by the binarised mask into the part to keep
  (``video·(1-mask)``, "inactive") and the part to generate (``video·mask``, "reactive"); each is VAE-encoded
  (distribution mode, normalised) and the two are concatenated: 32 channels;
- the mask itself is folded from pixels to latents: each 8x8 pixel cell becomes 64 channels, nearest-exact in
  time: 64 channels, 96 in all;
- each reference image is letterboxed onto a white canvas of the video's size, encoded, padded with 16 zero
  channels and prepended as one more latent frame (mask 0 there); the noise latent gets the same extra frames, and
  decoding drops them (the pipeline decodes ``latents[:, :, references:]``).

Why on the latent, as the image-to-video conditioning: the positive and the negative pass see the same control
(diffusers passes one ``conditioning_latents`` to both), and decoding must know how many frames to drop.
ComfyUI's ``WanVaceToVideo`` takes the same inputs (``control_video``, ``control_masks``, ``reference_image``,
``strength``); it keeps the mask soft where diffusers binarises it, and we follow diffusers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...io.image_files import image_to_pil
from .image_conditioning import encode_video

VACE_KEY = "wan_vace"  # LatentHandle.extra key of the VaceCondition
MAX_REFERENCE_IMAGES = 4  # each one is a latent frame more; diffusers and ComfyUI workflows use one or two
MASK_CELL = 8  # the VAE's spatial compression: one mask channel per pixel of an 8x8 cell (64 channels)


@dataclass(frozen=True, eq=False)
class VaceCondition:
    """What a VACE forward adds to the noise latent: the control latents, their scale, and how many leading
    latent frames are reference images (dropped when decoding)."""

    control: torch.Tensor  # [B, 96, R + F, h, w] float32
    strength: float
    reference_frames: int

    def forward_inputs(self, transformer, batch: int, device, dtype) -> dict:
        """The VACE keyword inputs of one forward: the control for ``batch`` samples, one scale per VACE block."""
        control = self.control if self.control.shape[0] == batch else self.control[:1].expand(batch, -1, -1, -1, -1)
        scale = torch.full((len(transformer.config.vace_layers),), float(self.strength), device=device, dtype=dtype)
        return {"control_hidden_states": control.to(device, dtype), "control_hidden_states_scale": scale}

    def video_frames(self, samples: torch.Tensor) -> torch.Tensor:
        """The sampled latent without its reference frames: what is decoded."""
        return samples[:, :, self.reference_frames:]


def is_vace(transformer_config) -> bool:
    return getattr(transformer_config, "vace_layers", None) is not None


def reference_count(reference_images) -> int:
    """How many reference images an IMAGE batch holds (0 for None); ValueError past ``MAX_REFERENCE_IMAGES``."""
    count = 0 if reference_images is None else int(reference_images.shape[0]) if reference_images.dim() == 4 else 1
    if count > MAX_REFERENCE_IMAGES:
        raise ValueError(f"reference_images: {count} images given, at most {MAX_REFERENCE_IMAGES} are taken (each "
                         "adds a latent frame); join subjects into one image or pass fewer")
    return count


def _frames(images, count: int) -> list:
    """The first ``count`` frames of an IMAGE batch as PIL images, what diffusers' processor takes."""
    batch = images if images.dim() == 4 else images[None]
    return [image_to_pil(frame) for frame in batch[:count]]


def _mask_frames(masks, count: int) -> list:
    """ComfyUI MASK [N, H, W] (0..1, 1 = generate) -> 8-bit grey PIL frames."""
    import numpy as np
    from PIL import Image

    batch = masks if masks.dim() == 3 else masks[None]
    return [Image.fromarray(np.clip(frame.float().cpu().numpy() * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
            for frame in batch[:count]]


def _pad_frames(video: torch.Tensor, frames: int, value: float) -> torch.Tensor:
    """A [1, C, n, H, W] clip padded with constant frames to ``frames`` (ComfyUI pads a short control video)."""
    missing = frames - video.shape[2]
    if missing <= 0:
        return video
    return torch.cat([video, video.new_full((*video.shape[:2], missing, *video.shape[3:]), value)], dim=2)


def _video_and_mask(processor, control_video, control_masks, width: int, height: int, frames: int) -> tuple:
    """(video in -1..1, mask in 0..1), both [1, C, frames, H, W]: absent video is grey, absent mask all ones."""
    if control_video is None:
        video = torch.zeros(1, 3, frames, height, width)
    else:
        video = processor.preprocess_video(_frames(control_video, frames), height, width).float()
        video = _pad_frames(video, frames, 0.0)
    if control_masks is None:
        return video, torch.ones_like(video)
    mask = processor.preprocess_video(_mask_frames(control_masks, frames), height, width).float()
    return video, _pad_frames(torch.clamp((mask + 1) / 2, min=0, max=1), frames, 1.0)


def _reference_canvas(processor, image, width: int, height: int) -> torch.Tensor:
    """One reference image fitted inside width x height (aspect kept, bilinear) on a white canvas: [1, 3, 1, H, W]."""
    pixels = processor.preprocess(image_to_pil(image), None, None).float()
    image_height, image_width = pixels.shape[-2:]
    scale = min(height / image_height, width / image_width)
    new_height, new_width = int(image_height * scale), int(image_width * scale)
    resized = torch.nn.functional.interpolate(pixels, size=(new_height, new_width), mode="bilinear",
                                              align_corners=False)[0]
    top, left = (height - new_height) // 2, (width - new_width) // 2
    canvas = torch.ones(3, height, width)
    canvas[:, top:top + new_height, left:left + new_width] = resized
    return canvas[None, :, None]


def _latent_mask(mask: torch.Tensor, latent_frames: int, references: int) -> torch.Tensor:
    """[1, C, F, H, W] pixel mask -> [64, R + latent_frames, H/8, W/8]: each 8x8 cell's pixels as channels."""
    single = mask[0, 0]
    frames, height, width = single.shape
    cells = single.view(frames, height // MASK_CELL, MASK_CELL, width // MASK_CELL, MASK_CELL)
    cells = cells.permute(2, 4, 0, 1, 3).flatten(0, 1)
    cells = torch.nn.functional.interpolate(cells[None], size=(latent_frames, *cells.shape[-2:]),
                                            mode="nearest-exact")[0]
    return torch.cat([cells.new_zeros(cells.shape[0], references, *cells.shape[-2:]), cells], dim=1)


def encode_vace_condition(pipeline, control_video, control_masks, reference_images, width: int, height: int,
                          frames: int, strength: float, latent_shape: tuple) -> VaceCondition:
    """The ``VaceCondition`` of a VACE model's ``pipeline`` for a control video (IMAGE, or None for none), its
    masks (MASK: 1 where the video is generated, or None for all), reference images (IMAGE batch, or None) at
    ``width`` x ``height`` and ``frames``; ``latent_shape`` is the noise latent's, reference frames included.
    A control clip longer than ``frames`` is cut, a shorter one padded with grey frames (mask 1), as ComfyUI."""
    from diffusers.video_processor import VideoProcessor

    processor = VideoProcessor(vae_scale_factor=MASK_CELL)
    references = reference_count(reference_images)
    video, mask = _video_and_mask(processor, control_video, control_masks, width, height, frames)
    keep = torch.where(mask > 0.5, 1.0, 0.0)
    control = torch.cat([encode_video(pipeline, video * (1 - keep)), encode_video(pipeline, video * keep)], dim=1)
    batch = reference_images if reference_images is None or reference_images.dim() == 4 else reference_images[None]
    for index in range(references):
        encoded = encode_video(pipeline, _reference_canvas(processor, batch[index], width, height))
        control = torch.cat([torch.cat([encoded, torch.zeros_like(encoded)], dim=1), control], dim=2)
    latent_mask = _latent_mask(mask, control.shape[2] - references, references)
    control = torch.cat([control, latent_mask[None]], dim=1)
    return VaceCondition(control=control.repeat(latent_shape[0], 1, 1, 1, 1), strength=float(strength),
                         reference_frames=references)


def check_vace_inputs(model_name: str, transformer_config, control_video, control_masks,
                      reference_images) -> None:
    """ValueError naming the input when the model has no VACE branch or an input is not an image batch."""
    if not is_vace(transformer_config):
        raise ValueError(f"model {model_name!r} has no VACE control branch (vace_blocks); load a Wan VACE model "
                         "(Wan2.1 VACE 1.3B/14B or the Wan2.2 VACE Fun experts)")
    for name, value, dims in (("control_video", control_video, (4,)), ("control_masks", control_masks, (2, 3)),
                              ("reference_images", reference_images, (3, 4))):
        if value is not None and (not isinstance(value, torch.Tensor) or value.dim() not in dims):
            raise ValueError(f"{name}: expected a ComfyUI {'MASK' if name == 'control_masks' else 'IMAGE'} "
                             f"batch, got {getattr(value, 'shape', type(value).__name__)}")
