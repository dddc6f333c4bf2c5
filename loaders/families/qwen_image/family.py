"""The Qwen-Image family object: one transformer on 2x2-packed image latents, loaded as ``QwenImagePipeline``."""

from __future__ import annotations

from typing import Optional

import torch

from ...handles import ConditioningHandle, LatentHandle
from ..diffusers_flow import DiffusersFlowFamily, check_multiple, text_device
from ..interface import ROLE_DENOISER, SHARED_INDEX_ROLES, TinyRecipe
from . import contracts, keymap
from .prediction import QwenPrediction, pack_qwen_latents, renormalize, unpack_qwen_latents

FAMILY_ID = "qwen_image"
DENOISER = "transformer"


class QwenImageFamily(DiffusersFlowFamily):
    id = FAMILY_ID
    model_families = (FAMILY_ID,)
    renormalize = staticmethod(renormalize)
    index_roles = {DENOISER: ROLE_DENOISER, **SHARED_INDEX_ROLES}
    lora_components = (DENOISER,)
    # QwenImagePipeline arrived in diffusers 0.35, Qwen2.5-VL text encoders in transformers 4.49
    requirements = {FAMILY_ID: {"diffusers": "0.35", "transformers": "4.49"}}
    labels = {FAMILY_ID: "Qwen-Image"}
    real_configs = ("qwen-image",)
    tiny_models = (TinyRecipe("tiny-qwen-image", FAMILY_ID, ".qwen_image", "build_tiny_qwen_image"),)

    def detect(self, model_index: dict) -> Optional[str]:
        return self.id if str(model_index.get("_class_name", "")).startswith("QwenImage") else None

    def assemble_single_files(self, source):
        """``QwenImagePipeline`` from the single files' modules (the scheduler the Qwen-Image folders ship)."""
        from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

        parts = source.components
        return QwenImagePipeline(transformer=parts[DENOISER], vae=parts["vae"],
                                 scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=parts["text_encoder"],
                                 tokenizer=source.tokenizer)

    # LoRA key map and contracts (no ``prepare`` rewrite: absent alpha means scale 1.0, as diffusers' own Qwen
    # converter does)
    recognizes = staticmethod(keymap.recognizes)
    map_target = staticmethod(keymap.map_target)
    declared_contract = staticmethod(contracts.declared_contract)

    # text, latents, prediction
    def encode_text(self, model, text: str) -> ConditioningHandle:
        with torch.no_grad():
            embeds, mask = model.pipeline.encode_prompt(prompt=text, device=text_device(model))
        return ConditioningHandle(embeds=embeds.float().cpu(), family=model.family, text=text,
                                  mask=mask.cpu() if mask is not None else None)

    def latent_shape(self, model, width: int, height: int, frames: int, batch: int) -> tuple:
        vae = model.pipeline.vae.config
        spatial = 2 ** len(vae.temperal_downsample)
        check_multiple(width, height, spatial * 2, model)  # latents are packed in 2x2 patches
        return (batch, vae.z_dim, 1, height // spatial, width // spatial)

    def empty_latent(self, model, width: int, height: int, frames: int = 1, batch: int = 1) -> LatentHandle:
        shape = self.latent_shape(model, width, height, frames, batch)
        return LatentHandle(samples=torch.zeros(shape), family=model.family, kind="image")

    def prediction(self, model, positive, negative, latent) -> QwenPrediction:
        return QwenPrediction(self, model, positive, negative, tuple(latent.samples.shape[-2:]))

    def to_model_space(self, x, latent):
        return pack_qwen_latents(x)

    def from_model_space(self, x, latent):
        return unpack_qwen_latents(x, *latent.samples.shape[-2:])
