"""Qwen-Image's native single-file key layouts: its transformer (diffusers' identity mapping for
``QwenImageTransformer2DModel``) and ComfyUI's Qwen2.5-VL text encoder files (``comfy/text_encoders/llama.py``
``Qwen25_7BVLI``: the original checkpoint names ``model.layers.N...`` / ``visual.blocks.N...``). Its VAE files
have the Wan VAE's layout (``wan.key_layouts.vae_layout_for``).
"""

from __future__ import annotations

from ...io.key_layouts import KeyLayout
from .single_files import EDIT_2511_MARKER

# QwenImageTransformer2DModel's single files use the diffusers names (diffusers maps them with identity).
# ComfyUI's Qwen-Image-Edit-2511 files also carry an empty marker tensor (``EDIT_2511_MARKER``, what the Qwen-Image
# family reads the edition from); it holds no weight.
QWEN_IMAGE_TRANSFORMER = KeyLayout("qwen_image_transformer", (), native_only=(EDIT_2511_MARKER,))

# transformers >= 4.52 nests the language model and the vision tower under ``model.``; the files keep the
# original checkpoint names.
QWEN25_VL_ENCODER = KeyLayout("qwen25_vl_encoder", (
    ("model.language_model", "model"),
    ("model.visual", "visual"),
))
