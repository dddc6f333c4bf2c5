"""``TensorParallelPlan``: what a family says about splitting one of its denoisers across ranks.

Why a value of its own: the engine (``tensor_parallel``) shards any denoiser the same way, through diffusers'
colwise/rowwise styles; only the facts differ per model (which linears split along which axis, the head count the
degree must divide, and what must change after the split, such as Wan's cross-head RMSNorm). The family's
``sampling.tensor_parallel_plan(denoiser)`` returns one, so no engine module names a family's layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class TensorParallelPlan:
    """``linears``: diffusers' ``_tp_plan`` form, ``{"blocks.*.attn1.to_q": "colwise", ...}`` (a colwise layer
    keeps its rows ``out/N``, a rowwise one its columns ``in/N`` and all-reduces its output). ``heads``: the
    attention heads per layer, which the degree must divide (each rank runs ``heads/N`` whole heads). ``adapt``:
    ``adapt(denoiser, mesh)`` run once after the linears are split, for what the split alone leaves wrong (a
    processor that reads the head count, a norm over all heads); None when nothing is."""

    linears: dict
    heads: int
    adapt: Optional[Callable] = None
