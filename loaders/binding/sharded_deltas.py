"""Fusing LoRA into a tensor-parallel shard: each rank writes only the rows or columns it holds.

Why here and not a second patcher: ``patching.WeightPatcher`` already sums every contribution in float32 and
rounds once, keeps exact originals and rolls back; a sharded parameter differs only in WHICH part of the weight
the rank holds. So the patcher asks this module for the rank's local tensor and for each delta cut to the same
rows or columns (``sliced`` on the kind: a colwise shard takes the matching rows of ``up``, a rowwise shard the
matching columns of ``down``, a full diff its own rows or columns). Each element of the shard is then computed
from the same factor elements, by the same float32 dot product, as the same element of the unsharded fuse.

A sharded parameter is recognised by what it is (a ``DTensor`` whose placement is ``Shard(dim)``), not by a
plan: whoever sharded the model (``loaders.models.tensor_parallel``) needs to tell the patcher nothing. A
replicated parameter (a rowwise layer's bias) is patched whole on every rank, like an unsharded one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import nn

from ..errors import KeyMatchError, LoraBindError


@dataclass(frozen=True)
class LocalShard:
    """This rank's part of a sharded parameter: ``local`` holds rows/columns ``start:stop`` along ``dim`` of the
    whole (global) parameter."""

    local: torch.Tensor
    dim: int
    start: int
    stop: int

    def delta(self, delta, where: str = "", label: str = "a LoRA"):
        """``delta`` cut to this shard's rows or columns; ``KeyMatchError`` naming the kind when it cannot be."""
        refusal = getattr(delta, "shard_refusal", None)
        sliced = getattr(delta, "sliced", None)
        if refusal is None and sliced is None:
            refusal = "it has no rule for taking a shard's rows or columns"
        if refusal is None:
            try:
                return sliced(self.dim, self.start, self.stop)
            except ValueError as exc:
                refusal = str(exc)
        raise KeyMatchError(f"{label}: its {delta.kind} delta cannot be fused into the tensor-parallel shard of "
                            f"'{where}': {refusal}. Fuse it on an unsharded model (no tp) or convert it to a "
                            f"plain LoRA.")

    def contributions(self, contributions: tuple, where: str = "") -> tuple:
        """The patcher's contributions with every delta cut to this shard (same keys and strengths)."""
        return tuple(replace(c, deltas=tuple(self.delta(d, where) for d in c.deltas)) for c in contributions)


def local_shard(tensor) -> Optional[LocalShard]:
    """The rank's ``LocalShard`` of a parameter sharded along one dimension; None for a plain tensor or a
    replicated DTensor (patched whole). Raises for a layout the patcher cannot cut (uneven or packed shards)."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return None
    from torch.distributed.tensor import Shard

    shards = [p for p in placements if isinstance(p, Shard)]
    if not shards:
        return None
    local = tensor.to_local()
    dim = shards[0].dim % tensor.dim()
    size = int(local.shape[dim])
    mesh = tensor.device_mesh
    if len(shards) > 1 or size * mesh.size() != int(tensor.shape[dim]):
        raise KeyMatchError(f"a parameter of shape {list(tensor.shape)} is split {placements} over "
                            f"{mesh.size()} ranks; LoRA fuses only one even split along one dimension")
    start = mesh.get_local_rank() * size
    return LocalShard(local, dim, start, start + size)


def local_part(tensor) -> tuple:
    """``(the tensor this rank holds, its LocalShard or None)``: a DTensor's local tensor (the whole value when
    replicated), a plain tensor itself."""
    shard = local_shard(tensor)
    if shard is not None:
        return shard.local, shard
    return (tensor.to_local() if hasattr(tensor, "placements") else tensor), None


def check_shardable(tensor, delta, label: str, where: str) -> None:
    """Refuses, before anything is written, a delta that could not be fused into ``tensor``'s shard; the error
    names the LoRA (``label``), the parameter and the kind's reason."""
    shard = local_shard(tensor)
    if shard is not None:
        shard.delta(delta, where, label)


def is_tensor_parallel(module: nn.Module) -> bool:
    """Whether any parameter of ``module`` is a sharded DTensor."""
    return any(local_shard(p) is not None for p in module.parameters())


def refuse_unfused_adapters(module: nn.Module, label: str) -> None:
    """Unfused (PEFT) adapters are refused on a tensor-parallel denoiser: peft wraps the base ``Linear`` and
    adds ``B @ A @ x`` computed from the whole input, while a sharded layer's rank holds part of its rows or
    columns, so the adapter's output would be added to the wrong part (or added N times)."""
    if is_tensor_parallel(module):
        raise LoraBindError(f"'{label}': unfused (PEFT) adapters cannot attach to a tensor-parallel denoiser "
                            f"(--parallel tp): peft's adapter layers are not sharded with the weights. Fuse the "
                            f"LoRA instead (it is fused exactly into each rank's shard).")
