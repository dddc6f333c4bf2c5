"""One Wan model prediction: the velocity v(x, σ) a sampling step asks a Wan transformer for.

Latents are [B, 16, F, H, W] and text embeds [B, seq, dim]. The denoiser's timestep is ``σ·1000``; with
``expand_timesteps`` (Wan2.2 TI2V) there is one timestep per latent token. Image-to-video conditioning (image
latents concatenated to the noise, CLIP image embeds) belongs here too: it is part of what one forward sees.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...generation.batch_rules import BatchRule
from ...generation.sampling import batched, device_and_dtype
from ...handles import ConditioningHandle, LatentHandle
from .image_conditioning import LATENT_KEY
from .vace_conditioning import VACE_KEY

# What the forwards below give a Wan transformer, for the step engine: the latent (with an I2V image's
# channels), the timestep (one per sample, or per token for TI2V), the text (always WAN_TEXT_TOKENS rows: UMT5's
# real tokens then zero rows, as WanPipeline pads them, so prompts stack without a mask), CLIP image states
# (Wan2.1 I2V) and the VACE control are per sample; VACE's per-block scale is one for the call.
BATCH_RULE = BatchRule(rows=frozenset({"hidden_states", "timestep", "encoder_hidden_states",
                                       "encoder_hidden_states_image", "control_hidden_states"}),
                       shared=frozenset({"return_dict", "control_hidden_states_scale"}))


class WanPrediction:
    """``predict(expert, x, sigma, uncond)`` for Wan transformers, through the sampling part's one forward."""

    def __init__(self, sampling, model, positive: ConditioningHandle, negative: Optional[ConditioningHandle],
                 latent: Optional[LatentHandle] = None):
        self.sampling = sampling
        self.model = model
        self.positive = positive.embeds
        self.negative = negative.embeds if negative is not None else None
        self.expand_timesteps = bool(model.model_index.get("expand_timesteps", False))
        self.image = latent.extra.get(LATENT_KEY) if latent is not None else None  # image-to-video conditioning
        self.control = latent.extra.get(VACE_KEY) if latent is not None else None  # VACE control conditioning

    def __call__(self, expert: str, x: torch.Tensor, sigma: float, uncond: bool) -> torch.Tensor:
        transformer = self.model.components[expert]
        device, dtype = device_and_dtype(transformer)
        batch = x.shape[0]
        embeds = batched(self.negative if uncond else self.positive, batch).to(device, dtype)
        t = sigma * 1000.0
        if self.image is not None:
            return self._image_to_video(expert, transformer, x, embeds, torch.tensor(t, dtype=torch.float32))
        if self.expand_timesteps:  # Wan2.2 TI2V: one timestep per latent token (all equal for text-to-video)
            _, _, frames, height, width = x.shape
            patch = transformer.config.patch_size
            tokens = (frames // patch[0]) * (height // patch[1]) * (width // patch[2])
            timestep = torch.full((batch, tokens), t, device=device, dtype=torch.float32)
        else:
            timestep = torch.full((batch,), t, device=device, dtype=torch.float32)
        control = {} if self.control is None else self.control.forward_inputs(transformer, batch, device, dtype)
        out = self.sampling.forward(self.model, expert, hidden_states=x.to(device, dtype), timestep=timestep,
                                  encoder_hidden_states=embeds, return_dict=False, **control)[0]
        return out.float()

    def _image_to_video(self, expert: str, transformer, x: torch.Tensor, embeds: torch.Tensor,
                        t: torch.Tensor) -> torch.Tensor:
        """The forward of an image-to-video step: the image conditioning decides the denoiser input, the
        timesteps (per token for TI2V) and the CLIP image states (Wan2.1 I2V), exactly as diffusers' pipeline."""
        device, dtype = device_and_dtype(transformer)
        inputs = {"hidden_states": self.image.hidden_states(x).to(device, dtype),
                  "timestep": self.image.timestep(t, x.shape[0], transformer.config.patch_size).to(device)}
        if self.image.image_embeds is not None:
            inputs["encoder_hidden_states_image"] = self.image.image_embeds.to(device, dtype)
        out = self.sampling.forward(self.model, expert, encoder_hidden_states=embeds, return_dict=False, **inputs)[0]
        return out.float()
