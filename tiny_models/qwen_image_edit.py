"""Tiny Qwen-Image-Edit and Qwen-Image-Edit-Plus (2509/2511) pipelines with random weights, built offline.

The published edit models are the Qwen-Image MMDiT (same shapes), Qwen-Image's VAE and Qwen2.5-VL-7B *with its
vision tower*, which reads the input images inside the prompt. So next to the text-to-image parts this builds a
Qwen2.5-VL whose vision token ids are the tokenizer's ``<|vision_start|>``/``<|image_pad|>``/... tokens, and the
``Qwen2VLProcessor`` the pipelines call (the tokenizer plus Qwen2-VL's image processor). The image processor keeps
Qwen2-VL's patch rules (14-pixel patches, 2x2 merge) with a smaller pixel budget (``max_pixels``), so an input
image is a few dozen vision tokens, not a thousand. The Plus model has Edit-2511's ``zero_cond_t`` (the reference
images' tokens see timestep 0), the one config field that tells 2511 from 2509.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..loaders.families.qwen_image.edit_processor import PROCESSOR_FOLDER, image_only_processor, new_image_processor
from ._common import diffusers_dir, save_pipeline_atomically, seeded
from .qwen_image import text_encoder, transformer, vae
from .tokenizers import QWEN_VISION_TOKENS, build_qwen_edit_tokenizer

EDIT_NAME = "tiny-qwen-image-edit"
EDIT_PLUS_NAME = "tiny-qwen-image-edit-plus"
# Qwen2-VL's image processor rules at a tiny budget: at most 64 patches of 14 px (16 vision tokens after the
# 2x2 merge) per image; the real processor allows 12845056 pixels.
PATCH_PIXELS = 14 * 14
MAX_PIXELS = 64 * PATCH_PIXELS
MIN_PIXELS = 16 * PATCH_PIXELS
_VISION_ID_FIELDS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")


def _processor(tokenizer):
    return image_only_processor(new_image_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS), tokenizer)


def build_qwen_image_edit_pipeline(plus: bool):
    """``QwenImageEditPipeline`` (``plus`` False) or ``QwenImageEditPlusPipeline`` with Edit-2511's config."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline, QwenImageEditPlusPipeline

    tokenizer = build_qwen_edit_tokenizer()
    vision_ids = dict(zip(_VISION_ID_FIELDS, tokenizer.convert_tokens_to_ids(list(QWEN_VISION_TOKENS))))
    vision_ids["vision_token_id"] = vision_ids["image_token_id"]
    with seeded(10):
        encoder = text_encoder(tokenizer, vision_ids)
    with seeded(11):
        autoencoder = vae(spatial_downsamples=3)
    with seeded(12 if plus else 13):
        denoiser = transformer(zero_cond_t=True) if plus else transformer()
    pipeline_class = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    return pipeline_class(transformer=denoiser, vae=autoencoder, scheduler=FlowMatchEulerDiscreteScheduler(),
                          text_encoder=encoder, tokenizer=tokenizer, processor=_processor(tokenizer))


def _published_processor_entry(folder: Path) -> None:
    """``finish`` step: the ``processor`` index entry the published edit folders have (``Qwen2VLProcessor``), not
    the class our constructor makes (its ``save_pretrained`` already wrote the published files)."""
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text(encoding="utf-8"))
    index[PROCESSOR_FOLDER] = ["transformers", "Qwen2VLProcessor"]
    index_file.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def _build(plus: bool, folder: Path) -> Path:
    return save_pipeline_atomically(build_qwen_image_edit_pipeline(plus), folder, finish=_published_processor_entry)


def build_tiny_qwen_image_edit(models_root) -> Path:
    return _build(False, diffusers_dir(models_root) / EDIT_NAME)


def build_tiny_qwen_image_edit_plus(models_root) -> Path:
    return _build(True, diffusers_dir(models_root) / EDIT_PLUS_NAME)
