"""Wan2.1 / Wan2.2 LoRA key map: file module names onto diffusers' ``WanTransformer3DModel``.

File names come in two namings. *Native* (the original Wan code, used by LightX2V, ComfyUI and kohya/musubi):
``blocks.N.self_attn.q``, ``cross_attn.k_img``, ``ffn.0``, ``norm3``, ``head.head``, ``modulation`` ...
*Diffusers* (``WanTransformer3DModel``): ``blocks.N.attn1.to_q``, ``attn2.add_k_proj``, ``ffn.net.0.proj`` ...
The diffusers names below were read from ``diffusers/models/transformers/transformer_wan.py`` (0.42) and checked
on a tiny model: ``WanTransformerBlock`` has ``norm1`` (no affine), ``attn1``, ``attn2``, ``norm2`` (the
cross-attention norm, affine: native ``norm3``), ``ffn.net.{0.proj,2}``, ``norm3`` (no affine: native ``norm2``)
and the parameter ``scale_shift_table`` (native ``modulation``); the model has ``patch_embedding`` (Conv3d),
``condition_embedder.{time_embedder,text_embedder}.linear_{1,2}``, ``condition_embedder.time_proj``,
``condition_embedder.image_embedder.{norm1,ff.net.0.proj,ff.net.2,norm2}`` (I2V only),
``proj_out`` and a top-level ``scale_shift_table`` (native ``head.modulation``).

VACE models (``WanVACETransformer3DModel``) add ``vace_patch_embedding`` and ``vace_blocks.N``: a main block's
modules plus ``proj_in`` (block 0 only) and ``proj_out``. ComfyUI's layout names them ``vace_blocks.N.before_proj``
/ ``after_proj`` with the native block names inside (``comfy/ldm/wan/model.py``: ``VaceWanAttentionBlock``); a
model without them (every non-VACE Wan) has nothing for those keys to act on (``VACE_BRANCH_REASON``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Optional

from ...lora.canonical import LoraFile, TargetPatch
from ...lora.layouts import redot
from ..parts import KeyMap

_PROJ = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "k_img": "add_k_proj", "v_img": "add_v_proj"}
_ATTN = {"self_attn": "attn1", "cross_attn": "attn2"}
_IMAGE_EMBED = "condition_embedder.image_embedder"

# native name (full match) -> diffusers name; \1 is the block index where there is one
_NATIVE_RULES = tuple((re.compile(pattern), build) for pattern, build in (
    (r"blocks\.(\d+)\.(self_attn|cross_attn)\.(q|k|v|o)", lambda m: f"blocks.{m[1]}.{_ATTN[m[2]]}.{_PROJ[m[3]]}"),
    (r"blocks\.(\d+)\.cross_attn\.(k_img|v_img)", lambda m: f"blocks.{m[1]}.attn2.{_PROJ[m[2]]}"),
    (r"blocks\.(\d+)\.(self_attn|cross_attn)\.(norm_q|norm_k)", lambda m: f"blocks.{m[1]}.{_ATTN[m[2]]}.{m[3]}"),
    (r"blocks\.(\d+)\.cross_attn\.norm_k_img", lambda m: f"blocks.{m[1]}.attn2.norm_added_k"),
    (r"blocks\.(\d+)\.ffn\.0", lambda m: f"blocks.{m[1]}.ffn.net.0.proj"),
    (r"blocks\.(\d+)\.ffn\.2", lambda m: f"blocks.{m[1]}.ffn.net.2"),
    # native norm3 is the affine cross-attention norm = diffusers norm2. Native norm2 has no parameters, so a
    # diff on "norm2" can only be the diffusers name and passes through unchanged (see _DIFFUSERS_NAME).
    (r"blocks\.(\d+)\.norm3", lambda m: f"blocks.{m[1]}.norm2"),
    (r"blocks\.(\d+)\.modulation", lambda m: f"blocks.{m[1]}.scale_shift_table"),
    (r"head\.head", lambda m: "proj_out"),
    (r"head\.modulation", lambda m: "scale_shift_table"),
    (r"text_embedding\.(0|2)", lambda m: f"condition_embedder.text_embedder.linear_{1 if m[1] == '0' else 2}"),
    (r"time_embedding\.(0|2)", lambda m: f"condition_embedder.time_embedder.linear_{1 if m[1] == '0' else 2}"),
    (r"time_projection\.1", lambda m: "condition_embedder.time_proj"),
    (r"img_emb\.proj\.(0|1|3|4)",
     lambda m: f"{_IMAGE_EMBED}.{ {'0': 'norm1', '1': 'ff.net.0.proj', '3': 'ff.net.2', '4': 'norm2'}[m[1]] }"),
))

_DIFFUSERS_NAME = re.compile(
    r"blocks\.\d+\.(attn1\.(to_q|to_k|to_v|to_out\.0|norm_q|norm_k)"
    r"|attn2\.(to_q|to_k|to_v|to_out\.0|norm_q|norm_k|add_k_proj|add_v_proj|norm_added_k)"
    r"|ffn\.net\.0\.proj|ffn\.net\.2|norm2|scale_shift_table)"
    r"|condition_embedder\.((time|text)_embedder\.linear_[12]|time_proj"
    r"|image_embedder\.(norm1|norm2|ff\.net\.0\.proj|ff\.net\.2))"
    r"|proj_out|patch_embedding|scale_shift_table")

# multi-word name parts, so kohya/musubi "blocks_0_cross_attn_k_img" can be re-dotted
_NAME_TOKENS = frozenset({
    "self_attn", "cross_attn", "k_img", "v_img", "norm_k_img", "norm_q", "norm_k", "text_embedding",
    "time_embedding", "time_projection", "patch_embedding", "img_emb", "to_q", "to_k", "to_v",
    "to_out", "add_k_proj", "add_v_proj", "norm_added_k", "condition_embedder", "time_embedder", "text_embedder",
    "image_embedder", "time_proj", "linear_1", "linear_2", "proj_out", "scale_shift_table",
    "vace_blocks", "vace_patch_embedding", "before_proj", "after_proj", "proj_in"})

# Anchored on Wan's own block names: other families have add_k_proj / add_v_proj too (Qwen-Image's text-stream
# projections, ``transformer_blocks.N.attn.add_k_proj``), and those are another family's keys, not an image branch.
_IMAGE_BRANCH = re.compile(
    r"^(vace_)?blocks\.\d+\.(cross_attn\.(k_img|v_img|norm_k_img)|attn2\.(add_k_proj|add_v_proj|norm_added_k))$"
    r"|^(img_emb|condition_embedder\.image_embedder)\.")
_VACE_BRANCH = re.compile(r"^vace_(blocks\.\d+\.|patch_embedding$)")
VACE_BRANCH_REASON = ("Wan VACE control-branch key (vace_blocks / vace_patch_embedding); this model has no VACE "
                      "branch (only the Wan VACE models do), so it has nothing to act on")
_VACE_PREFIX = "vace_"
# a VACE block's own projections: ComfyUI's native names and diffusers' names
_VACE_OWN = re.compile(r"vace_blocks\.(\d+)\.(before_proj|after_proj|proj_in|proj_out)")
_VACE_PROJECTIONS = {"before_proj": "proj_in", "after_proj": "proj_out", "proj_in": "proj_in", "proj_out": "proj_out"}
IMAGE_BRANCH_REASON = ("Wan2.1 I2V image-branch key (CLIP image cross-attention / img_emb); this model has no "
                       "image branch (Wan2.2 experts and Wan2.1 T2V have none), so it has nothing to act on")


def _to_diffusers(name: str) -> Optional[str]:
    """One file-side name -> diffusers; a VACE block's names are a main block's under ``vace_blocks``."""
    if name == "vace_patch_embedding":
        return name
    own = _VACE_OWN.fullmatch(name)
    if own:
        return f"vace_blocks.{own[1]}.{_VACE_PROJECTIONS[own[2]]}"
    if name.startswith("vace_blocks."):
        inner = _to_diffusers(name[len(_VACE_PREFIX):])
        return None if inner is None else _VACE_PREFIX + inner
    if _DIFFUSERS_NAME.fullmatch(name):
        return name
    for pattern, build in _NATIVE_RULES:
        match = pattern.fullmatch(name)
        if match:
            return build(match)
    return None


def map_target(name: str) -> Optional[str]:
    """Native or diffusers Wan name (kohya-flattened too) -> diffusers ``WanTransformer3DModel`` path."""
    return _to_diffusers(name) or _to_diffusers(redot(name, _NAME_TOKENS))


# diffusers names other families share (Qwen-Image also has proj_out); they alone do not make a file Wan's
_SHARED_NAMES = frozenset({"proj_out", "patch_embedding", "scale_shift_table"})


def recognizes(lora: LoraFile) -> bool:
    return any(map_target(name) not in (None, *_SHARED_NAMES) for name in lora.targets)


def prepare(lora: LoraFile, model_family: str) -> LoraFile:
    """kijai's WanVideoWrapper rewrites ``blocks.N.diff_m`` as ``blocks.N.modulation.diff``: fold it back into
    a ``modulation`` parameter diff of ``blocks.N`` so it maps to ``scale_shift_table``. Absent alpha stays 1.0
    (LightX2V semantics: alpha-free x2v files have alpha folded into the factors)."""
    rewritten, changed = {}, False
    for name, patch in lora.targets.items():
        if name.endswith(".modulation") and patch.low_rank is None and set(patch.param_diffs) == {"weight"}:
            parent = name[: -len(".modulation")]
            if parent in lora.targets:
                return lora  # both spellings in one file: leave it, the mapping reports the clash
            rewritten[parent] = TargetPatch(module=parent, param_diffs={"modulation": patch.param_diffs["weight"]},
                                            source_keys={"modulation": patch.all_source_keys()})
            changed = True
        else:
            rewritten[name] = patch
    return replace(lora, targets=rewritten) if changed else lora


def expected_unmatched_reason(name: str, model_family: str) -> Optional[str]:
    dotted = redot(name, _NAME_TOKENS)
    if _IMAGE_BRANCH.match(name) or _IMAGE_BRANCH.match(dotted):
        return IMAGE_BRANCH_REASON
    if _VACE_BRANCH.match(name) or _VACE_BRANCH.match(dotted):
        return VACE_BRANCH_REASON
    return None


KEYMAP = KeyMap(recognizes=recognizes, map_target=map_target, prepare=prepare,
                expected_unmatched_reason=expected_unmatched_reason)
