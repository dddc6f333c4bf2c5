"""Wan's tensor-parallel plan: which linears of a ``WanTransformer3DModel`` (Wan2.1, the Wan2.2 experts, I2V,
TI2V and VACE, which share the block) split across ranks, and what must change after the split.

Why diffusers has none: Wan normalises q and k over ALL heads (``qk_norm="rms_norm_across_heads"``:
``RMSNorm(heads · head_dim)``), so a colwise shard holding ``heads/N`` heads needs a norm whose mean square is
summed across ranks (``cross_rank_norm.CrossRankRMSNorm``). And Wan's attention processor reshapes q, k
and v with ``attn.heads``, so each split attention must say it now runs ``heads/N`` heads.

The plan, per block (``blocks.*``, and ``vace_blocks.*`` where present), in diffusers' ``_tp_plan`` form:
q, k, v (and the I2V image branch's ``add_k_proj``/``add_v_proj``) colwise, the output projection rowwise, in both
attentions; the FFN's first linear colwise and its second rowwise. So each rank computes whole heads and its
slice of the FFN width, and one all-reduce per rowwise layer joins them. Embeddings, modulation tables, VACE's
``proj_in``/``proj_out`` and the head stay whole on every rank.
"""

from __future__ import annotations

from torch import nn

from ...errors import ModelLoadError
from ..parts.tensor_parallel import TensorParallelPlan
from .cross_rank_norm import CrossRankRMSNorm

BLOCK_LISTS = ("blocks", "vace_blocks")
ATTENTIONS = ("attn1", "attn2")
COLWISE_PROJECTIONS = ("to_q", "to_k", "to_v", "add_k_proj", "add_v_proj")
ACROSS_HEAD_NORMS = ("norm_q", "norm_k", "norm_added_k")


def wan_tensor_parallel_plan(denoiser: nn.Module) -> TensorParallelPlan:
    """The plan for one Wan denoiser; refuses a layout it does not know (fused q/k/v projections)."""
    linears: dict = {}
    for list_name in _block_lists(denoiser):
        block = getattr(denoiser, list_name)[0]
        for attention_name in ATTENTIONS:
            attention = getattr(block, attention_name)
            if getattr(attention, "fused_projections", False):
                raise ModelLoadError(f"wan: --parallel tp cannot split {list_name}.*.{attention_name}: its q/k/v "
                                     f"projections are fused; load the model without fused projections")
            for projection in COLWISE_PROJECTIONS:
                if getattr(attention, projection, None) is not None:
                    linears[f"{list_name}.*.{attention_name}.{projection}"] = "colwise"
            linears[f"{list_name}.*.{attention_name}.to_out.0"] = "rowwise"
        linears[f"{list_name}.*.ffn.net.0.proj"] = "colwise"
        linears[f"{list_name}.*.ffn.net.2"] = "rowwise"
    return TensorParallelPlan(linears=linears, heads=int(denoiser.config.num_attention_heads),
                              adapt=adapt_split_attention)


def adapt_split_attention(denoiser: nn.Module, mesh) -> None:
    """After the split: each attention runs ``heads/N`` heads, and its across-head norms become cross-rank."""
    degree = mesh.size()
    for list_name in _block_lists(denoiser):
        for block in getattr(denoiser, list_name):
            for attention_name in ATTENTIONS:
                attention = getattr(block, attention_name)
                attention.heads //= degree
                for norm_name in ACROSS_HEAD_NORMS:
                    norm = getattr(attention, norm_name, None)
                    if isinstance(norm, nn.RMSNorm) and _spans_heads(norm, attention):
                        setattr(attention, norm_name, CrossRankRMSNorm(norm, mesh))


def _spans_heads(norm: nn.RMSNorm, attention: nn.Module) -> bool:
    """Whether ``norm`` normalises all of the attention's heads at once (not one head's features)."""
    return tuple(norm.normalized_shape) == (int(attention.inner_dim),)


def _block_lists(denoiser: nn.Module) -> list:
    return [name for name in BLOCK_LISTS
            if isinstance(getattr(denoiser, name, None), nn.ModuleList) and len(getattr(denoiser, name))]
