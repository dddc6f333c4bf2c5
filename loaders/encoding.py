"""Text encoding and empty latents, through each family's own tokenizer, text encoder and VAE geometry.

Why through the pipeline's ``encode_prompt``: the prompt template, padding and truncation rules (Qwen-Image drops
its 34-token system prefix, Wan pads UMT5 output to a fixed length) are part of what the denoiser was trained on;
re-implementing them would drift from diffusers. Latent geometry comes from the VAE config the same way.
"""

from __future__ import annotations

import torch

from .handles import ConditioningHandle, LatentHandle
from .model_store import LoadedModel

# WanPipeline.__call__ pads UMT5 output to 512 tokens (Wan's text_len); its encode_prompt's own default is 226,
# which would change what the cross-attention sees, so we pass the __call__ value explicitly.
WAN_TEXT_TOKENS = 512


def _text_device(model: LoadedModel):
    return next(model.pipeline.text_encoder.parameters()).device


def encode_text(model: LoadedModel, text: str) -> ConditioningHandle:
    """Encode one prompt with the model's own text encoder (embeds on the CPU in float32, batch 1)."""
    if model.family == "minimax_h3":
        from . import minimax_h3_sampling

        return minimax_h3_sampling.encode_prompt(model, text)
    with torch.no_grad():
        if model.family == "qwen_image":
            embeds, mask = model.pipeline.encode_prompt(prompt=text, device=_text_device(model))
        else:
            embeds, _ = model.pipeline.encode_prompt(
                prompt=text, do_classifier_free_guidance=False, max_sequence_length=WAN_TEXT_TOKENS,
                device=_text_device(model),
            )
            mask = None
    return ConditioningHandle(
        embeds=embeds.float().cpu(), family=model.family, text=text, mask=mask.cpu() if mask is not None else None
    )


def latent_shape(model: LoadedModel, width: int, height: int, frames: int, batch: int) -> tuple[int, ...]:
    """The family's latent shape for a width x height (x frames) output; raises ValueError naming the bad field."""
    vae = model.pipeline.vae.config
    spatial = 2 ** len(vae.temperal_downsample)
    if model.family == "qwen_image":
        multiple = spatial * 2  # latents are packed in 2x2 patches
        _check_multiple(width, height, multiple, model)
        return (batch, vae.z_dim, 1, height // spatial, width // spatial)
    patch = model.components["transformer"].config.patch_size
    multiple = spatial * patch[1]
    _check_multiple(width, height, multiple, model)
    temporal = 2 ** sum(bool(d) for d in vae.temperal_downsample)
    if frames < 1 or (frames - 1) % temporal:
        raise ValueError(f"frames must be {temporal}·k + 1 for {model.name} (e.g. 1, {temporal + 1}, "
                         f"{2 * temporal + 1}), got {frames}")
    return (batch, vae.z_dim, (frames - 1) // temporal + 1, height // spatial, width // spatial)


def _check_multiple(width: int, height: int, multiple: int, model: LoadedModel) -> None:
    for field_name, value in (("width", width), ("height", height)):
        if value < multiple or value % multiple:
            raise ValueError(f"{field_name} must be a positive multiple of {multiple} for {model.name}, got {value}")


def empty_latent(model: LoadedModel, width: int, height: int, frames: int = 1, batch: int = 1) -> LatentHandle:
    """A zero latent of the family's shape: the sampler's start point for text-to-video / text-to-image."""
    if model.family == "minimax_h3":
        from . import minimax_h3_sampling

        return minimax_h3_sampling.empty_latents(model, width=width, height=height, frames=frames, batch=batch)
    shape = latent_shape(model, width, height, frames, batch)
    kind = "image" if model.family == "qwen_image" else "video"
    return LatentHandle(samples=torch.zeros(shape), family=model.family, kind=kind)
