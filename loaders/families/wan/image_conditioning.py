"""Wan image-to-video conditioning: a start image (and an optional end image) -> what each denoiser forward sees.

The three Wan variants condition on the image differently; this follows diffusers' ``pipeline_wan_i2v.py``
(0.42) step for step, so our sampler's latents equal ``WanImageToVideoPipeline``'s on the same sigmas:

- **Wan2.2 I2V A14B** (denoiser ``in_channels`` 36 = 16 noise + 4 mask + 16 image): the video
  ``[start, zeros…, (end)]`` is VAE-encoded (distribution mode) and normalised with ``latents_mean``/``latents_std``;
  a frame mask (1 on the given frames, the first one repeated over the VAE's 4x temporal compression) is packed to
  4 channels per latent frame; both are concatenated to the noise latent at every forward.
- **Wan2.1 I2V**: the same concatenation, plus the CLIP vision encoder's penultimate hidden states of the image(s)
  as ``encoder_hidden_states_image`` for the transformer's image branch (``image_dim``).
- **Wan2.2 TI2V-5B** (``expand_timesteps``): only the start image is encoded; it *replaces* the first latent frame
  at every forward and in the result, and that frame's tokens get timestep 0 (one timestep per token).

Why an object on the latent and not on the prompt: the positive and the negative pass see the same image
conditioning (diffusers passes one ``condition``/``image_embeds`` to both), so it belongs with the latent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...io.image_files import image_to_pil

LATENT_KEY = "wan_image"  # LatentHandle.extra key of the ImageCondition


@dataclass(frozen=True, eq=False)
class ImageCondition:
    """What a Wan denoiser forward adds to the noise latent ``x`` for image-to-video."""

    variant: str  # ``image_variant`` of the model it was made for
    condition: torch.Tensor  # [B, C, F, h, w] float32: mask + image latents (concatenated), or TI2V's image latents
    image_embeds: Optional[torch.Tensor] = None  # [N, tokens, image_dim] CLIP hidden states (Wan2.1 I2V)
    first_frame_mask: Optional[torch.Tensor] = None  # [1, 1, F, h, w] TI2V: 0 on the image frame, 1 elsewhere
    has_end_image: bool = False

    def hidden_states(self, x: torch.Tensor) -> torch.Tensor:
        """The denoiser input for the noisy latent ``x``."""
        if self.first_frame_mask is not None:
            mask = self.first_frame_mask.to(x.device)
            return (1 - mask) * self.condition.to(x.device) + mask * x
        return torch.cat([x, self.condition.to(x.device, x.dtype)], dim=1)

    def timestep(self, t: torch.Tensor, batch: int, patch_size) -> torch.Tensor:
        """Per-token timesteps for TI2V (0 on the image frame's tokens), else one per sample."""
        if self.first_frame_mask is None:
            return t.expand(batch)
        _, height_patch, width_patch = patch_size
        per_token = (self.first_frame_mask[0][0][:, ::height_patch, ::width_patch].to(t.device) * t).flatten()
        return per_token.unsqueeze(0).expand(batch, -1)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The sampled latent: TI2V puts the encoded image back as the first frame, exactly."""
        if self.first_frame_mask is None:
            return x
        mask = self.first_frame_mask.to(x.device)
        return (1 - mask) * self.condition.to(x.device) + mask * x


VARIANT_NAMES = {"ti2v": "Wan2.2 TI2V (first frame fixed, per-token timesteps)",
                 "i2v_clip": "Wan2.1 I2V (image latents + CLIP image branch)",
                 "i2v": "Wan2.2 I2V (image latents concatenated)", "t2v": "text-to-video"}


def image_variant(transformer_config, model_index: dict) -> str:
    """"ti2v", "i2v_clip" (Wan2.1 I2V), "i2v" (Wan2.2 I2V A14B) or "t2v" for a denoiser config."""
    if model_index.get("expand_timesteps"):
        return "ti2v"
    if transformer_config.in_channels > transformer_config.out_channels:
        return "i2v_clip" if transformer_config.image_dim is not None else "i2v"
    return "t2v"


def encode_video(pipeline, frames: torch.Tensor) -> torch.Tensor:
    """VAE mode of ``frames`` [B, 3, F, H, W] in -1..1, normalised as the pipelines do (float32)."""
    vae = pipeline.vae
    param = next(vae.parameters())
    with torch.no_grad():
        latents = vae.encode(frames.to(param.device, param.dtype)).latent_dist.mode()
    latents = latents.float()
    channels = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, channels, 1, 1, 1).to(latents.device, torch.float32)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, channels, 1, 1, 1).to(latents.device,
                                                                                           torch.float32)
    return ((latents - mean) * inverse_std).cpu()


def clip_image_processor(image_size: int):
    """CLIP's preprocessing (resize, centre crop, CLIP mean/std) for an encoder taking ``image_size`` pixels:
    what the Wan2.1 I2V folders ship (224) and what the tiny one and its single files use.

    transformers 5 without torchvision falls back from ``CLIPImageProcessor`` to the PIL implementation with a
    warning; asking for the PIL one directly (where it exists) gives the same result and a stable saved config.
    """
    try:
        from transformers import CLIPImageProcessorPil as processor_class
    except ImportError:  # transformers 4.x: one implementation
        from transformers import CLIPImageProcessor as processor_class
    return processor_class(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})


def _clip_embeds(pipeline, images: list) -> torch.Tensor:
    encoder = pipeline.image_encoder
    param = next(encoder.parameters())
    inputs = pipeline.image_processor(images=images, return_tensors="pt").to(param.device)
    with torch.no_grad():
        hidden = encoder(**inputs, output_hidden_states=True).hidden_states[-2]
    return hidden.float().cpu()


def encode_image_condition(model, transformer_config, start_image, end_image, width: int, height: int,
                           frames: int, latent_shape: tuple) -> ImageCondition:
    """The ``ImageCondition`` of a loaded Wan model for a start IMAGE (and optional end IMAGE) at ``width`` x
    ``height`` and ``frames``; ``latent_shape`` is the noise latent's shape ([B, C, F, h, w]).

    Raises ValueError naming the input when the model cannot take it (a text-to-video model; an end image on a
    model that conditions on one image only).
    """
    from diffusers.video_processor import VideoProcessor

    pipeline, model_name = model.pipeline, model.name
    variant = image_variant(transformer_config, model.model_index)
    if variant == "t2v":
        raise ValueError(f"model {model_name!r} is a text-to-video model (its transformer takes "
                         f"{transformer_config.in_channels} input channels, no image); use an image-to-video model "
                         "(Wan2.2 I2V A14B, Wan2.1 I2V or Wan2.2 TI2V-5B)")
    if end_image is not None and variant == "ti2v":
        raise ValueError(f"end_image: model {model_name!r} (Wan2.2 TI2V) conditions on the first frame only")
    if end_image is not None and variant == "i2v_clip" and transformer_config.pos_embed_seq_len is None:
        raise ValueError(f"end_image: model {model_name!r} (Wan2.1 I2V) encodes one image in its CLIP branch; "
                         "first-and-last-frame needs the Wan2.1 FLF2V model (pos_embed_seq_len set)")
    if end_image is None and variant == "i2v_clip" and transformer_config.pos_embed_seq_len is not None:
        raise ValueError(f"end_image: model {model_name!r} is the Wan2.1 first-and-last-frame model (FLF2V): its "
                         "CLIP branch takes a start and an end image; connect an end image, or use a Wan2.1 I2V "
                         "model for a start image alone")
    vae_config = pipeline.vae.config
    spatial = getattr(vae_config, "scale_factor_spatial", None) or 2 ** len(vae_config.temperal_downsample)
    processor = VideoProcessor(vae_scale_factor=spatial)
    start_pil = image_to_pil(start_image)
    start = processor.preprocess(start_pil, height=height, width=width).float().unsqueeze(2)  # [1, 3, 1, H, W]
    batch_size, _, latent_frames, latent_height, latent_width = latent_shape

    if variant == "ti2v":
        condition = encode_video(pipeline, start).repeat(batch_size, 1, 1, 1, 1)
        mask = torch.ones(1, 1, latent_frames, latent_height, latent_width)
        mask[:, :, 0] = 0
        return ImageCondition(variant=variant, condition=condition, first_frame_mask=mask)

    pieces = [start, start.new_zeros(1, 3, frames - 1 - (end_image is not None), height, width)]
    if end_image is not None:
        pieces.append(processor.preprocess(image_to_pil(end_image), height=height, width=width).float().unsqueeze(2))
    image_latents = encode_video(pipeline, torch.cat(pieces, dim=2)).repeat(batch_size, 1, 1, 1, 1)
    temporal = vae_config.scale_factor_temporal if hasattr(vae_config, "scale_factor_temporal") else 4
    frame_mask = torch.ones(batch_size, 1, frames, latent_height, latent_width)
    frame_mask[:, :, 1:frames - 1 if end_image is not None else frames] = 0
    first = torch.repeat_interleave(frame_mask[:, :, 0:1], dim=2, repeats=temporal)
    frame_mask = torch.cat([first, frame_mask[:, :, 1:]], dim=2)
    frame_mask = frame_mask.view(batch_size, -1, temporal, latent_height, latent_width).transpose(1, 2)
    condition = torch.cat([frame_mask, image_latents], dim=1)
    embeds = None
    if variant == "i2v_clip":
        images = [start_pil] if end_image is None else [start_pil, image_to_pil(end_image)]
        embeds = _clip_embeds(pipeline, images)
    return ImageCondition(variant=variant, condition=condition, image_embeds=embeds,
                          has_end_image=end_image is not None)

