"""The Qwen-Image family (``FAMILY``): one transformer on 2x2-packed image latents, loaded as ``QwenImagePipeline``;
its layout, contracts and sampling parts (the key map is ``keymap``)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from ...handles import ConditioningHandle, LatentHandle
from ...io.image_files import image_to_pil
from ..diffusers_flow import (
    DiffusersFlowSampling,
    OneScheduleContracts,
    check_multiple,
    dtype_kwargs,
    pipeline_class,
    text_device,
)
from ..interface import SOURCE_DIFFUSERS, ModelFamily, TinyRecipe
from ..parts import FamilyLayout
from ..roles import ROLE_DENOISER, SHARED_INDEX_ROLES
from . import contracts, edit, single_files
from . import single_file_kinds as files
from .edit_processor import load_processor
from .keymap import KEYMAP
from .prediction import BATCH_RULE, QwenPrediction, pack_qwen_latents, renormalize, unpack_qwen_latents

FAMILY_ID = "qwen_image"
EDIT_2511_REQUIREMENTS = "qwen_image_edit_2511"  # its ``requirements`` entry (the tiny Edit-Plus has 2511's config)
DENOISER = "transformer"


class QwenImageLayout(FamilyLayout):
    index_roles = {DENOISER: ROLE_DENOISER, **SHARED_INDEX_ROLES}
    lora_components = (DENOISER,)
    # QwenImagePipeline arrived in diffusers 0.35, Qwen2.5-VL text encoders in transformers 4.49. Edit-2511's
    # transformer option ``zero_cond_t`` is not in diffusers 0.36.0 (checked) and is in 0.42; 0.37 is assumed.
    requirements = {FAMILY_ID: {"diffusers": "0.35", "transformers": "4.49"},
                    EDIT_2511_REQUIREMENTS: {"diffusers": "0.37", "transformers": "4.49"}}
    labels = {FAMILY_ID: "Qwen-Image", EDIT_2511_REQUIREMENTS: "Qwen-Image-Edit-2511"}
    real_configs = ("qwen-image",)
    tiny_models = (TinyRecipe("tiny-qwen-image", FAMILY_ID), TinyRecipe("tiny-qwen-image-edit", FAMILY_ID),
                   TinyRecipe("tiny-qwen-image-edit-plus", EDIT_2511_REQUIREMENTS))
    single_file_kinds = files.KINDS
    known_single_files = files.KNOWN_MODELS
    file_name_words = "qwen"
    example_templates = ("qwen_image_lightning", "qwen_image_edit_lightning")
    featured_examples = 2

    def detect(self, model_index: dict) -> Optional[str]:
        return FAMILY_ID if str(model_index.get("_class_name", "")).startswith("QwenImage") else None

    single_file_edition = staticmethod(single_files.single_file_edition)

    def requirements_id(self, model_family, model_index=None, variant=None, folder=None):
        """Edit-2511 needs ``zero_cond_t`` (a newer diffusers than Qwen-Image itself): a single file says so by its
        detected edition, a folder only in its transformer's config. Why check the folder too: an older diffusers
        ignores the config field it does not know and would run the edit model as 2509, silently wrong."""
        if variant == single_files.EDIT_2511 or (folder is not None and edit.needs_zero_cond_t(folder)):
            return EDIT_2511_REQUIREMENTS
        return model_family


class QwenImageContracts(OneScheduleContracts):
    """Lightning distill contracts by name; a Lightning file made for the other task (edit or text-to-image)
    is refused."""

    declared_contract = staticmethod(contracts.declared_contract)

    def check_artifact(self, model, file_name: str, component: str) -> None:
        super().check_artifact(model, file_name, component)
        edits = self.family.sampling.edit_variant(model) is not None
        contracts.check_lightning_task(model, file_name, component, edits)


class QwenImageSampling(DiffusersFlowSampling):
    """One transformer on 2x2-packed latents, with true-CFG renormalisation; an edit model reads its prompt
    together with the input images."""

    renormalize = staticmethod(renormalize)

    def load_pipeline(self, source):
        """An edit folder gets its processor built here (``edit_processor``: transformers cannot construct it
        without torchvision); everything else loads as any diffusers folder."""
        if source.kind != SOURCE_DIFFUSERS or edit.pipeline_variant(source.model_index) is None:
            return super().load_pipeline(source)
        return pipeline_class(source).from_pretrained(source.path, local_files_only=True, use_safetensors=True,
                                                      processor=load_processor(source.path),
                                                      **dtype_kwargs(source.dtype), **source.components)

    def edit_variant(self, model) -> Optional[str]:
        """How the model takes input images: ``edit.EDIT``, ``edit.EDIT_PLUS``, or None (text-to-image)."""
        return edit.pipeline_variant(model.model_index)

    def assemble_single_files(self, source):
        """``QwenImagePipeline`` from the single files' modules (the scheduler the Qwen-Image folders ship), or the
        edit pipeline (with its processor) for an edit file (``single_files``: the marker or the name says which)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        parts = source.components
        edition = source.denoiser_files[0].edition if source.denoiser_files else None
        pipeline_class, variant = single_files.edit_pipeline_class(edition)
        extra = {} if variant is None else {"processor": single_files.edit_processor(source.tokenizer,
                                                                                        os.path.basename(source.path))}
        return pipeline_class(transformer=parts[DENOISER], vae=parts["vae"], scheduler=FlowMatchEulerDiscreteScheduler(),
                              text_encoder=parts["text_encoder"], tokenizer=source.tokenizer, **extra)

    # text, latents, prediction
    def encode_text(self, model, text: str) -> ConditioningHandle:
        variant = self.edit_variant(model)
        if variant is not None:
            raise ValueError(f"model {model.name!r} is {edit.RULES[variant].label}: its prompts are read together "
                             "with the input images; encode them with LoraBindTextEncodeImageEdit")
        with torch.no_grad():
            embeds, mask = model.pipeline.encode_prompt(prompt=text, device=text_device(model))
        return ConditioningHandle(embeds=embeds.float().cpu(), family=model.family, text=text,
                                  mask=mask.cpu() if mask is not None else None)

    def encode_with_images(self, model, text: str, images: list) -> ConditioningHandle:
        variant = self.edit_variant(model)
        if variant is None:
            raise ValueError(f"model {model.name!r} is Qwen-Image text-to-image: it takes no input images; load a "
                             "Qwen-Image-Edit model, or encode the prompt with LoraBindTextEncode")
        return edit.encode_edit_prompt(model, text, images, variant, text_device(model))

    def image_rules(self, model, images: list) -> list:
        """The resizing lines of an edit (node output): each image's sizes and the pipeline's default output."""
        variant = self.edit_variant(model)
        if variant is None:
            return []
        pictures = [image_to_pil(image) for image in images]
        multiple = 2 ** len(model.pipeline.vae.config.temperal_downsample) * 2
        width, height = edit.default_output_size(variant, pictures, multiple)
        return [f"output size the pipeline would pick for these images: {width}x{height} (about 1024² of area at "
                f"the aspect ratio of image_{1 if edit.RULES[variant].output_from == 0 else len(pictures)}); the "
                "latent's width and height decide"]

    def check_inputs(self, model, positive, negative, latent, schedule) -> None:
        edit.check_conditioning(model.name, self.edit_variant(model), positive, negative, schedule.cfg != 1.0)
        super().check_inputs(model, positive, negative, latent, schedule)

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

    def batch_rule(self, model, component: str):
        return BATCH_RULE

    def to_model_space(self, x, latent):
        return pack_qwen_latents(x)

    def from_model_space(self, x, latent):
        return unpack_qwen_latents(x, *latent.samples.shape[-2:])


# no ``prepare`` rewrite in its key map: absent alpha means scale 1.0, as diffusers' own Qwen converter does
FAMILY = ModelFamily(id=FAMILY_ID, model_families=(FAMILY_ID,), layout=QwenImageLayout(), keymap=KEYMAP,
                     contracts=QwenImageContracts(), sampling=QwenImageSampling(), runs_stages=True)
