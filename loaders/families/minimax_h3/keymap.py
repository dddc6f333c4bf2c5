"""MiniMax-H3 LoRA key map onto diffusers' ``MiniMaxH3Transformer3DModel``.

Files come in two namings:

* diffusers layout (LightX2V Turbo): ``transformer_blocks.N.attn.to_q``, ``ff.net.0.proj``, … — already ours;
* native layout (FlashGen, trainers on the original checkpoint): ``blocks.N.attn.qkv_proj`` (fused), ``mlp.fc1``
  (fused SwiGLU), ``adaln_proj.linear``, ``token_refiner.blocks.N``, ``final_layer.adaln_proj.linear``, …

``prepare`` rewrites the native fused layers into diffusers' separate ones (row permutations of ``lora_B``, so
the delta is exact) and applies the family's alpha rules; ``map_target`` then only renames. The contract logic
lives in ``contracts`` / ``resolve`` next to this module.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Optional

from ...errors import KeyMatchError
from ...lora.canonical import LoraFile, TargetPatch
from ..parts import KeyMap
from .contracts import (
    NATIVE_KEY_FORMAT,
    NATIVE_QKV_LAYOUT,
    TURBO_KEY_FORMAT,
    native_contract,
    parse_turbo_name,
    refuse_unverifiable,
    turbo_alpha,
)

# Every released MiniMax-H3 partition (and our tiny models) uses 128-wide heads; the grouped fused-QKV layout is
# one group per query head (heads_per_group = 1), so a group is [q_h; k_h; v_h] of 128 rows each.
HEAD_DIM = 128
HEADS_PER_GROUP = 1

_NATIVE_STANDALONE = {
    "video_patch_proj": "proj_in",
    "audio_patch_proj": "audio_proj_in",
    "condition_proj": "context_embedder",
    "time_embedder.proj_in": "time_embedder.linear_1",
    "time_embedder.proj_out": "time_embedder.linear_2",
    "final_layer.adaln_proj.linear": "norm_out.linear",
    "final_layer.video_out": "proj_out",
    "final_layer.audio_out": "audio_proj_out",
}
_NATIVE_IN_BLOCK = {
    "attn.out_proj": "attn.to_out.0",
    "mlp.fc1": "ff.net.0.proj",
    "mlp.fc2": "ff.net.2",
}
_BLOCK_PREFIXES = (
    (re.compile(r"^token_refiner\.blocks\.(\d+)\.(.+)$"), "token_refiner.refiner_blocks.{}.{}"),
    (re.compile(r"^blocks\.(\d+)\.(.+)$"), "transformer_blocks.{}.{}"),
)
# diffusers module paths a MiniMax-H3 LoRA may target.
_DIFFUSERS_TARGET = re.compile(
    r"^(?:"
    r"transformer_blocks\.\d+\.(?:attn\.(?:to_q|to_k|to_v|to_out\.0)|ff\.net\.(?:0\.proj|2)|adaln_proj\.linear)"
    r"|token_refiner\.refiner_blocks\.\d+\.(?:attn\.(?:to_q|to_k|to_v|to_out\.0)|ff\.net\.(?:0\.proj|2))"
    r"|proj_in|audio_proj_in|context_embedder|time_embedder\.linear_[12]|norm_out\.linear|proj_out|audio_proj_out"
    r")$"
)
# Names only MiniMax-H3 uses among the supported families (native fused layers, refiner, AdaLN projections).
_FAMILY_SIGNAL = re.compile(
    r"(?:^|\.)(?:attn\.qkv_proj|mlp\.fc[12]|adaln_proj\.linear|final_layer\.)|^token_refiner\."
    r"|^transformer_blocks\.\d+\.ff\.net\.0\.proj$"
)


def recognizes(lora: LoraFile) -> bool:
    """MiniMax-H3 by metadata, published file name, or module names no other supported family uses."""
    if str(lora.metadata.get("key_format", "")).startswith("minimax-h3"):
        return True
    if lora.name.startswith("minimax_h3_"):
        return True
    return any(_FAMILY_SIGNAL.search(name) for name in lora.targets)


def reorder_grouped_qkv(rows, head_dim: int = HEAD_DIM, heads_per_group: int = HEADS_PER_GROUP):
    """Grouped fused-QKV rows ``[q_g, k_g, v_g]`` per group → ``[Q; K; V]`` (a row permutation, so exact)."""
    import torch

    per_group = (heads_per_group + 2) * head_dim
    if rows.shape[0] % per_group:
        raise KeyMatchError(
            f"fused qkv_proj has {rows.shape[0]} output rows, not a multiple of {per_group} "
            f"(({heads_per_group} + 2) x {head_dim}): not a grouped MiniMax-H3 QKV projection"
        )
    groups = rows.reshape(rows.shape[0] // per_group, per_group, *rows.shape[1:])
    q, k, v = groups.split([heads_per_group * head_dim, head_dim, head_dim], dim=1)
    return torch.cat([part.reshape(-1, *rows.shape[1:]) for part in (q, k, v)], dim=0)


def _only_low_rank_pairs(file_name: str, name: str, patch: TargetPatch) -> None:
    """MiniMax-H3 files are plain low-rank pairs: their alpha default and the fused QKV/fc1 row surgery are rules
    for ``up`` rows. Another adapter kind (LoHa, LoKr, DoRA) on such a file is refused by name, not mis-split."""
    kind = None if patch.low_rank is None else patch.low_rank.kind
    if kind not in (None, "lora"):
        raise KeyMatchError(f"{file_name}: module {name!r} is a {kind} adapter; MiniMax-H3 LoRA files are read as "
                            f"plain low-rank pairs (lora_A/lora_B) only")


def _split_qkv(name: str, patch: TargetPatch, grouped: bool) -> dict:
    """Fused ``attn.qkv_proj`` → ``to_q``/``to_k``/``to_v``: ``lora_B`` rows (grouped layout reordered to
    ``[Q; K; V]`` first) are cut in thirds; the shared ``lora_A`` goes to all three."""
    extra_params = set(patch.param_diffs) - {"weight"}
    if extra_params:
        raise KeyMatchError(f"{name}: MiniMax-H3 QKV projections have no {sorted(extra_params)} to patch")
    reorder = reorder_grouped_qkv if grouped else (lambda tensor: tensor)
    up = None if patch.low_rank is None else reorder(patch.low_rank.up)
    diff = patch.param_diffs.get("weight")
    diff = None if diff is None else reorder(diff)
    rows = (up if up is not None else diff).shape[0]
    if rows % 3:
        raise KeyMatchError(f"{name} has {rows} output rows, not divisible by 3: not a fused QKV projection")
    third, prefix = rows // 3, name[: -len("qkv_proj")]
    pieces = {}
    for i, proj in enumerate(("to_q", "to_k", "to_v")):
        cut = slice(i * third, (i + 1) * third)
        low_rank = None if up is None else replace(patch.low_rank, up=up[cut].contiguous())
        diffs = {} if diff is None else {"weight": diff[cut].contiguous()}
        pieces[prefix + proj] = TargetPatch(module=prefix + proj, low_rank=low_rank, param_diffs=diffs,
                                            source_keys=patch.source_keys)
    return pieces


def _swap_swiglu_halves(tensor):
    """Native ``fc1`` rows are [gate; value]; diffusers' SwiGLU ``ff.net.0.proj`` computes ``value * silu(gate)``
    from [value; gate] (``SwiGLU.forward``: ``hidden, gate = proj(x).chunk(2)``). Swap the halves."""
    import torch

    if tensor.shape[0] % 2:
        raise KeyMatchError(f"mlp.fc1 has {tensor.shape[0]} output rows, not even: not a fused SwiGLU projection")
    gate, value = tensor.chunk(2, dim=0)
    return torch.cat([value, gate], dim=0).contiguous()


def _swap_fc1(name: str, patch: TargetPatch) -> TargetPatch:
    low_rank = None if patch.low_rank is None else replace(patch.low_rank, up=_swap_swiglu_halves(patch.low_rank.up))
    diffs = {k: (_swap_swiglu_halves(v) if k in ("weight", "bias") else v) for k, v in patch.param_diffs.items()}
    return TargetPatch(module=name, low_rank=low_rank, param_diffs=diffs, source_keys=patch.source_keys)


def _artifact_kind(lora: LoraFile) -> Optional[str]:
    """"native" (FlashGen metadata), "turbo" (published Turbo name or metadata) or None (another MiniMax LoRA)."""
    metadata = lora.metadata or {}
    if metadata.get("key_format") == NATIVE_KEY_FORMAT:
        return "native"
    if parse_turbo_name(lora.name) is not None or metadata.get("key_format") == TURBO_KEY_FORMAT:
        return "turbo"
    return None


def _default_alpha(lora: LoraFile, kind: Optional[str]) -> Optional[float]:
    """Alpha for pairs without a per-layer alpha; None keeps the reader's rule (scale 1)."""
    if kind == "native":
        # the pair scale is metadata lora_alpha / lora_rank (64/64 = 1 for the published file); the metadata is
        # validated (ContractError naming the field) before it is trusted
        return native_contract(lora.name, lora.metadata, None).alpha
    if kind == "turbo":
        # diffusers' MiniMaxH3LoraLoaderMixin loads alpha-less files at alpha = rank; the Turbo contract (LightX2V
        # reference --lora-alpha default) is alpha 8, unless the metadata declares one. We follow the contract.
        return turbo_alpha(lora.name, lora.metadata)
    return None


def prepare(lora: LoraFile, model_family: str) -> LoraFile:
    """Apply the family alpha rules and split fused native layers; returns a new ``LoraFile`` (the input may be
    cached by the reader, so it is never modified). ComfyUI fused-QKV Turbo exports and renamed Turbo files are
    refused here too (ContractError naming the file), so they are never bound with a guessed layout or alpha."""
    if (lora.metadata or {}).get("key_format") != NATIVE_KEY_FORMAT:
        refuse_unverifiable(lora.name, lora.metadata)
    kind = _artifact_kind(lora)
    alpha = _default_alpha(lora, kind)
    grouped = (lora.metadata or {}).get("qkv_layout") == NATIVE_QKV_LAYOUT
    targets = {}
    for name, patch in lora.targets.items():
        _only_low_rank_pairs(lora.name, name, patch)
        if alpha is not None and patch.low_rank is not None and patch.low_rank.alpha is None:
            delta = patch.low_rank
            patch = replace(patch, low_rank=replace(delta, alpha=alpha, scale=alpha / delta.rank))
        if name.endswith("attn.qkv_proj"):
            targets.update(_split_qkv(name, patch, grouped))
        elif name.endswith("mlp.fc1"):
            targets[name] = _swap_fc1(name, patch)
        else:
            targets[name] = patch
    return replace(lora, targets=targets, format=f"minimax-h3-{kind}" if kind else lora.format)


def map_target(name: str) -> Optional[str]:
    """File-side module name → diffusers module path of ``MiniMaxH3Transformer3DModel``; None if unknown."""
    if name in _NATIVE_STANDALONE:
        name = _NATIVE_STANDALONE[name]
    else:
        for pattern, template in _BLOCK_PREFIXES:
            match = pattern.match(name)
            if match:
                inner = _NATIVE_IN_BLOCK.get(match[2], match[2])
                name = template.format(match[1], inner)
                break
    return name if _DIFFUSERS_TARGET.match(name) else None


def expected_unmatched_reason(name: str, model_family: str) -> Optional[str]:
    """MiniMax-H3 models have no optional branches (unlike Wan's I2V image branch): every key must bind."""
    return None


KEYMAP = KeyMap(recognizes=recognizes, map_target=map_target, prepare=prepare,
                expected_unmatched_reason=expected_unmatched_reason)
