"""Qwen-Image LoRA key map onto diffusers' ``QwenImageTransformer2DModel``.

Qwen-Image LoRAs already use the diffusers module names of ``QwenImageTransformer2DModel`` (ComfyUI's and
LightX2V's Qwen model keep them too), read from ``diffusers/models/transformers/transformer_qwenimage.py`` (0.42)
and checked on a tiny model: ``transformer_blocks.N.attn.{to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,
add_v_proj,to_add_out,norm_q,norm_k,norm_added_q,norm_added_k}``, ``transformer_blocks.N.{img_mod.1,txt_mod.1,
img_mlp.net.0.proj,img_mlp.net.2,txt_mlp.net.0.proj,txt_mlp.net.2}`` and top-level ``img_in``, ``txt_in``,
``txt_norm``, ``proj_out``, ``norm_out.linear``, ``time_text_embed.timestep_embedder.linear_{1,2}``. The only
rewrite needed is re-dotting kohya/musubi ``lora_unet_transformer_blocks_0_attn_to_q`` names.
"""

from __future__ import annotations

import re
from typing import Optional

from ...lora.canonical import LoraFile
from ...lora.layouts import redot
from ..parts import KeyMap

_MODULE_NAME = re.compile(
    r"transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out"
    r"|norm_q|norm_k|norm_added_q|norm_added_k)|(img|txt)_mod\.1|(img|txt)_mlp\.net\.(0\.proj|2))"
    r"|img_in|txt_in|txt_norm|proj_out|norm_out\.linear|time_text_embed\.timestep_embedder\.linear_[12]")
# Parts no other supported family uses (MiniMax-H3's diffusers layout also has transformer_blocks.N.attn.to_q).
_QWEN_SPECIFIC = re.compile(r"(^|\.)(img_mod|txt_mod|img_mlp|txt_mlp|to_add_out|img_in|txt_in|txt_norm"
                            r"|time_text_embed)(\.|$)|^norm_out\.linear$")
_NAME_TOKENS = frozenset({
    "transformer_blocks", "to_q", "to_k", "to_v", "to_out", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "norm_q", "norm_k", "norm_added_q", "norm_added_k", "img_mod", "txt_mod", "img_mlp", "txt_mlp", "img_in",
    "txt_in", "txt_norm", "proj_out", "norm_out", "time_text_embed", "timestep_embedder", "linear_1", "linear_2"})


def map_target(name: str) -> Optional[str]:
    for candidate in (name, redot(name, _NAME_TOKENS)):
        if _MODULE_NAME.fullmatch(candidate):
            return candidate
    return None


def recognizes(lora: LoraFile) -> bool:
    return any(_QWEN_SPECIFIC.search(mapped) for mapped in filter(None, map(map_target, lora.targets)))


KEYMAP = KeyMap(recognizes=recognizes, map_target=map_target)
