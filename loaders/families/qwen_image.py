"""Qwen-Image key map and Lightning distill contracts.

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

from ..handles import ScheduleContract
from ..lora.canonical import LoraFile
from ..lora.layouts import redot
from ._common import distill_contract

FAMILY = "qwen_image"
MODEL_FAMILIES = ("qwen_image",)

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


def prepare(lora: LoraFile, model_family: str) -> LoraFile:
    """Nothing to rewrite: absent alpha means scale 1.0 (diffusers' own Qwen converter does the same)."""
    return lora


def expected_unmatched_reason(name: str, model_family: str) -> Optional[str]:
    return None


_LIGHTNING = re.compile(r"lightning", re.IGNORECASE)
# Qwen-Image-Lightning's reference scheduler (README/"We use shift=3 in distillation") is FlowMatchEuler with
# exponential dynamic shifting and base_shift = max_shift = log(3): mu = log(3) whatever the image size, and the
# exponential shift exp(mu) / (exp(mu) + 1/t - 1) equals the rectified-flow shift k·t / (1 + (k-1)·t) with k=3.
# QwenImagePipeline feeds it the uniform grid linspace(1, 1/N, N) and the scheduler appends 0, so the schedule is
# exactly shifted_sigmas(N, 3.0) (4 steps: 1.0, 0.9, 0.75, 0.5, 0.0). cfg: true_cfg_scale=1.0 (reference §2.9).
LIGHTNING_SHIFT = 3.0


def declared_contract(file_name: str, metadata: dict, rank: Optional[int]) -> Optional[ScheduleContract]:
    """``Qwen-Image-Lightning-4steps-V1.0.safetensors`` (and the Edit/2509/2512/2511 variants) -> N steps,
    shift 3, cfg 1."""
    if not _LIGHTNING.search(file_name):
        return None
    return distill_contract(file_name, "qwen_image", LIGHTNING_SHIFT, rank)


def checkpoint_contract(model_index: dict, model_name: str) -> Optional[ScheduleContract]:
    return None
