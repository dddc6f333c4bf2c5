"""The Wan family object: Wan2.1 (one transformer) and Wan2.2 MoE (``transformer`` = high-noise expert,
``transformer_2`` = low-noise expert, switching at ``boundary_ratio``), loaded as a diffusers ``WanPipeline``."""

from __future__ import annotations

from typing import Optional

import torch

from ...handles import ConditioningHandle, LatentHandle
from ..diffusers_flow import DiffusersFlowFamily, check_multiple, text_device
from ..interface import ROLE_DENOISER, ROLE_HIGH_NOISE, ROLE_LOW_NOISE
from . import contracts, keymap
from .prediction import WanPrediction

HIGH_NOISE_EXPERT = "transformer"
LOW_NOISE_EXPERT = "transformer_2"
# WanPipeline.__call__ pads UMT5 output to 512 tokens (Wan's text_len); its encode_prompt's own default is 226,
# which would change what the cross-attention sees, so we pass the __call__ value explicitly.
WAN_TEXT_TOKENS = 512


def _is_set(entry) -> bool:
    """A model_index component entry is set unless it is ``[null, null]`` (diffusers' "absent")."""
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] is not None and entry[1] is not None


class WanFamily(DiffusersFlowFamily):
    id = "wan"
    model_families = ("wan2.1", contracts.MOE_FAMILY)

    def detect(self, model_index: dict) -> Optional[str]:
        if not str(model_index.get("_class_name", "")).startswith("Wan"):
            return None
        return contracts.MOE_FAMILY if _is_set(model_index.get("transformer_2")) else "wan2.1"

    def denoiser_roles(self, model) -> dict:
        if model.family != contracts.MOE_FAMILY:
            return {name: ROLE_DENOISER for name in model.components}
        roles = {HIGH_NOISE_EXPERT: ROLE_HIGH_NOISE, LOW_NOISE_EXPERT: ROLE_LOW_NOISE}
        return {name: role for name, role in roles.items() if name in model.components}

    # LoRA key map and contracts
    recognizes = staticmethod(keymap.recognizes)
    prepare = staticmethod(keymap.prepare)
    map_target = staticmethod(keymap.map_target)
    expected_unmatched_reason = staticmethod(keymap.expected_unmatched_reason)
    declared_contract = staticmethod(contracts.declared_contract)
    check_resolved = staticmethod(contracts.check_expert_split)

    # Wan2.2 expert split
    def model_boundary(self, model) -> Optional[float]:
        """The checkpoint's own MoE boundary (``boundary_ratio``), None for single-expert models."""
        value = model.model_index.get("boundary_ratio")
        return float(value) if value is not None and model.family == contracts.MOE_FAMILY else None

    def effective_boundary(self, model, schedule) -> Optional[float]:
        """``schedule.boundary`` when set, else the model's ``boundary_ratio``; None when there is one expert."""
        if model.family != contracts.MOE_FAMILY:
            return None
        return float(schedule.boundary) if schedule.boundary is not None else self.model_boundary(model)

    def check_inputs(self, model, positive, negative, latent, schedule) -> None:
        if model.family == contracts.MOE_FAMILY and self.effective_boundary(model, schedule) is None:
            raise ValueError(f"model {model.name!r} has two experts but its model_index.json has no boundary_ratio; "
                             "set the sampler's boundary input (0.875 for T2V, 0.9 for I2V)")
        super().check_inputs(model, positive, negative, latent, schedule)

    # text, latents, prediction
    def encode_text(self, model, text: str) -> ConditioningHandle:
        with torch.no_grad():
            embeds, _ = model.pipeline.encode_prompt(
                prompt=text, do_classifier_free_guidance=False, max_sequence_length=WAN_TEXT_TOKENS,
                device=text_device(model),
            )
        return ConditioningHandle(embeds=embeds.float().cpu(), family=model.family, text=text, mask=None)

    def latent_shape(self, model, width: int, height: int, frames: int, batch: int) -> tuple:
        vae = model.pipeline.vae.config
        spatial = 2 ** len(vae.temperal_downsample)
        patch = model.components[HIGH_NOISE_EXPERT].config.patch_size
        check_multiple(width, height, spatial * patch[1], model)
        temporal = 2 ** sum(bool(d) for d in vae.temperal_downsample)
        if frames < 1 or (frames - 1) % temporal:
            raise ValueError(f"frames must be {temporal}·k + 1 for {model.name} (e.g. 1, {temporal + 1}, "
                             f"{2 * temporal + 1}), got {frames}")
        return (batch, vae.z_dim, (frames - 1) // temporal + 1, height // spatial, width // spatial)

    def empty_latent(self, model, width: int, height: int, frames: int = 1, batch: int = 1) -> LatentHandle:
        shape = self.latent_shape(model, width, height, frames, batch)
        return LatentHandle(samples=torch.zeros(shape), family=model.family, kind="video")

    def prediction(self, model, positive, negative, latent) -> WanPrediction:
        return WanPrediction(self, model, positive, negative)
