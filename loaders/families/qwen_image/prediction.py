"""One Qwen-Image model prediction on packed latents, the 2x2 patch packing, and the CFG renormalisation.

The transformer takes [B, (H/2)(W/2), 4C] rows (as ``QwenImagePipeline`` packs them) and ``timestep = σ``;
its "true CFG" rescales the guided prediction to the conditional one's norm.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

from ...generation.batch_rules import BatchRule
from ...generation.sampling import batched, device_and_dtype
from ...handles import ConditioningHandle

DENOISER = "transformer"
EDIT_KEY = "qwen_image_edit"  # ConditioningHandle.extra key of the input images (``edit.EditReference``)

# What ``QwenPrediction`` gives the transformer, for the step engine: packed latents (with an edit's image tokens
# after them), the timestep, the text and its mask are per sample, as are ``img_shapes`` and (older diffusers)
# ``txt_seq_lens``. Prompts differ in length and the joint attention takes the text mask, so shorter text is
# padded with masked rows; its rotary positions follow the image's, so padding at the end moves no real token.
BATCH_RULE = BatchRule(rows=frozenset({"hidden_states", "timestep", "encoder_hidden_states",
                                       "encoder_hidden_states_mask"}),
                       lists=frozenset({"img_shapes", "txt_seq_lens"}), shared=frozenset({"return_dict"}),
                       padded={"encoder_hidden_states": "encoder_hidden_states_mask"})


def pack_qwen_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, 1, H, W] -> [B, (H/2)(W/2), 4C]: Qwen-Image's 2x2 patch packing (as QwenImagePipeline does)."""
    batch, channels, _, height, width = latents.shape
    x = latents[:, :, 0].reshape(batch, channels, height // 2, 2, width // 2, 2)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack_qwen_latents(packed: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of ``pack_qwen_latents`` for a latent grid of ``height`` x ``width``."""
    batch, _, packed_channels = packed.shape
    channels = packed_channels // 4
    x = packed.reshape(batch, height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(batch, channels, 1, height, width)


def renormalize(guided: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """Qwen-Image rescales the guided prediction to the conditional one's norm."""
    return guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))


class QwenPrediction:
    """``predict(expert, x, sigma, uncond)`` for the Qwen-Image transformer, through the sampling part's one forward."""

    def __init__(self, sampling, model, positive: ConditioningHandle, negative: Optional[ConditioningHandle], grid):
        self.sampling = sampling
        self.model = model
        self.transformer = model.components[DENOISER]
        self.positive = (positive.embeds, positive.mask, positive.extra.get(EDIT_KEY))
        self.negative = (negative.embeds, negative.mask, negative.extra.get(EDIT_KEY)) if negative is not None else None
        self.grid = grid  # (latent height, latent width)
        # diffusers < 0.36 also wanted the text lengths; pass them only to transformers that take them.
        self.wants_txt_seq_lens = "txt_seq_lens" in inspect.signature(self.transformer.forward).parameters

    def __call__(self, expert: str, x: torch.Tensor, sigma: float, uncond: bool) -> torch.Tensor:
        device, dtype = device_and_dtype(self.transformer)
        batch = x.shape[0]
        embeds, mask, reference = self.negative if uncond else self.positive
        embeds = batched(embeds, batch).to(device, dtype)
        mask = batched(mask, batch).to(device) if mask is not None else None
        kwargs = {}
        if self.wants_txt_seq_lens:
            kwargs["txt_seq_lens"] = (mask.sum(dim=1).tolist() if mask is not None else [embeds.shape[1]] * batch)
        hidden = x.to(device, dtype)
        shapes = [(1, self.grid[0] // 2, self.grid[1] // 2)]
        if reference is not None:  # Qwen-Image-Edit: the input images' tokens follow the noise tokens
            hidden = reference.hidden_states(hidden)
            shapes += list(reference.shapes)
        out = self.sampling.forward(
            self.model, DENOISER,
            hidden_states=hidden, timestep=torch.full((batch,), sigma, device=device, dtype=dtype),
            encoder_hidden_states=embeds, encoder_hidden_states_mask=mask,
            img_shapes=[shapes] * batch, return_dict=False, **kwargs,
        )[0]
        return out[:, :x.shape[1]].float()  # the prediction for the noise tokens only
