"""Qwen-Image and Qwen-Image-Edit from ComfyUI's single files.

The edit transformers have exactly Qwen-Image's shapes (``QwenImageTransformer2DModel`` with the same widths and
60 blocks), so shapes cannot tell ``qwen_image_edit_2509_fp8_e4m3fn.safetensors`` from ``qwen_image_fp8_e4m3fn``.
What can: ComfyUI's Edit-2511 files carry an empty ``__index_timestep_zero__`` tensor (the buffer ComfyUI's
Qwen-Image model registers for 2511's reference-at-timestep-0 conditioning, diffusers' ``zero_cond_t``), and the
published names say the edition (``qwen_image_edit_fp8_e4m3fn``, ``qwen_image_edit_2509_{bf16,fp8_e4m3fn}``,
``qwen_image_edit_2511_{bf16,fp8_e4m3fn_scaled}``). So the marker decides 2511, and otherwise the file name
decides; a renamed 2509 or first-release Edit file loads as text-to-image Qwen-Image (rename it to say "edit").
"""

from __future__ import annotations

import os
import re

from ...errors import ModelLoadError
from . import edit
from .edit_processor import IMAGE_TOKEN, image_only_processor, load_processor_files, new_image_processor

EDIT_2511 = "Qwen-Image-Edit-2511"
# (edition, how the file says it, pipeline variant, transformer config changes), most specific first
EDITIONS = (
    (EDIT_2511, re.compile(r"edit[-_ ]?2511", re.IGNORECASE), edit.EDIT_PLUS, {"zero_cond_t": True}),
    ("Qwen-Image-Edit-2509", re.compile(r"edit[-_ ]?2509", re.IGNORECASE), edit.EDIT_PLUS, {}),
    ("Qwen-Image-Edit", re.compile(r"qwen[-_ ]?image[-_ ]?edit", re.IGNORECASE), edit.EDIT, {}),
)
EDIT_2511_MARKER = "__index_timestep_zero__"
# Qwen2.5-VL-7B-Instruct's preprocessor_config.json, which the Qwen-Image-Edit folders ship as processor/: the
# image processor a single-file set gets when no processor files sit beside its tokenizer.
PUBLISHED_PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}
_PROCESSOR_FILE = "preprocessor_config.json"


def single_file_edition(role: str, file_name: str, flags: tuple) -> tuple:
    """(edition or None, transformer config changes) of a Qwen-Image denoiser file."""
    if role != "denoiser":
        return None, {}
    for edition, named, _, changes in EDITIONS:
        if named.search(os.path.basename(file_name)) or (edition == EDIT_2511 and EDIT_2511_MARKER in flags):
            return edition, dict(changes)
    return None, {}


def edit_pipeline_class(edition):
    """The diffusers pipeline class of an edition (None: text-to-image ``QwenImagePipeline``)."""
    import diffusers

    variant = next((variant for name, _, variant, _ in EDITIONS if name == edition), None)
    by_variant = {v: k for k, v in edit.PIPELINE_VARIANTS.items()}
    return getattr(diffusers, by_variant.get(variant, "QwenImagePipeline")), variant


def edit_processor(tokenizer, source_name: str):
    """The Qwen2-VL processor of a single-file edit set: its tokenizer must have Qwen2.5-VL's vision tokens; the
    image processor is the one beside the tokenizer when its folder has one, else the published settings."""
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        raise ModelLoadError(f"{source_name}: an image-editing model needs Qwen2.5-VL's tokenizer with its vision "
                             f"tokens ({IMAGE_TOKEN}); the tokenizer found has none (ComfyUI's qwen25_tokenizer, or "
                             "a Qwen-Image-Edit folder's processor/, has them)")
    folder = str(getattr(tokenizer, "name_or_path", "") or "")
    if folder and os.path.isfile(os.path.join(folder, _PROCESSOR_FILE)):
        return load_processor_files(folder, tokenizer)
    return image_only_processor(new_image_processor(**PUBLISHED_PIXELS), tokenizer)
