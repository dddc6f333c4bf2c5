"""An RMSNorm over a feature dimension that tensor parallelism split across ranks.

Why: a model that normalises q and k over ALL heads at once (``RMSNorm(heads · head_dim)``, Wan's
``rms_norm_across_heads``) cannot run on a colwise shard with a plain RMSNorm: each rank holds ``heads/N`` heads,
and their mean square is not the whole row's. Here each rank sums the squares of its own features, one
all-reduce adds the ranks' sums, and every rank divides by the whole width: the same mean square on every rank,
up to the order of the float32 sum. The per-feature weight is held as a ``Shard(0)`` DTensor, so the LoRA patcher
(``binding.sharded_deltas``) fuses a full diff of the norm's weight into each rank's slice like any shard.
"""

from __future__ import annotations

import torch
from torch import nn


class CrossRankRMSNorm(nn.Module):
    """``x · rsqrt(mean(x²) + eps) · weight`` with the mean over the features of every rank in ``mesh``.

    The collective's wait is bounded by the process group's timeout (set where the group is created)."""

    def __init__(self, norm: nn.RMSNorm, mesh):
        super().__init__()
        from torch.distributed.tensor import DTensor, Shard

        if len(norm.normalized_shape) != 1:
            raise ValueError(f"a cross-rank RMSNorm splits one feature dimension, not {tuple(norm.normalized_shape)}")
        self.full_width = int(norm.normalized_shape[0])
        self.eps = norm.eps
        self.group = mesh.get_group()
        self.weight = None
        if norm.weight is not None:
            width = self.full_width // mesh.size()
            rank = mesh.get_local_rank()
            local = norm.weight.detach()[rank * width:(rank + 1) * width].clone()
            self.weight = nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False),
                                       requires_grad=norm.weight.requires_grad)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        upcast = hidden_states.to(torch.float32)  # as torch's rms_norm: the statistics in float32
        squares = upcast.pow(2).sum(dim=-1, keepdim=True)
        dist.all_reduce(squares, group=self.group)
        eps = self.eps if self.eps is not None else torch.finfo(hidden_states.dtype).eps
        normed = upcast * torch.rsqrt(squares / self.full_width + eps)
        if self.weight is not None:
            normed = normed * self.weight.to_local()
        return normed.type_as(hidden_states)
