"""The low-rank pair (plain LoRA): ``delta W = scale · up @ down``.

Scale rules, in order of precedence: a per-pair ``.alpha`` tensor gives ``alpha / rank`` (``alpha / sqrt(rank)``
when the PEFT config says rsLoRA); else a PEFT config gives ``lora_alpha``/``alpha_pattern`` over
``r``/``rank_pattern``; else 1.0 (LightX2V / x2v files have alpha folded in; a family's ``prepare`` may override).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Optional

import torch

from ...errors import LoraFileError
from ..finite_bounds import largest_abs, largest_norm, product_bound, rounding_growth
from .base import AdapterKind, PeftForm, alpha_of


@dataclass
class LowRankDelta:
    """``delta W = scale · up @ down`` on ``<module>.weight``.

    ``down`` is A with shape [rank, in] (conv: [rank, in, *k]); ``up`` is B with shape [out, rank] (conv:
    [out, rank, 1, ...]). ``alpha`` is what the file declared (None when absent); ``scale`` is the resolved
    multiplier (alpha/rank, alpha/sqrt(rank) for rsLoRA, 1.0 without alpha, or a family rule).
    """

    down: Any
    up: Any
    alpha: Optional[float]
    scale: float
    kind: str = "lora"

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])

    def delta_shape(self, weight_shape: tuple) -> Optional[tuple]:
        """``up @ down`` folded back to the weight's layout (linear [out, in]; conv [out, in, *k]); None when
        the factors do not form a rank-r product of that layout."""
        if int(self.up.shape[1]) != self.rank or any(int(s) != 1 for s in self.up.shape[2:]):
            return None
        if len(weight_shape) > 2 and (self.down.dim() != len(weight_shape) or self.up.dim() != len(weight_shape)):
            return None
        return (int(self.up.shape[0]),) + tuple(int(s) for s in self.down.shape[1:])

    def tensors(self) -> list:
        return [self.down, self.up]

    @cached_property
    def _longest(self) -> tuple:
        """((norm, row) of the longest row of ``up``, (norm, column) of the longest column of ``down``): the
        factors are small, and this is computed once per delta (it lives as long as the file's read)."""
        return largest_norm(self.up, dim=1), largest_norm(self.down, dim=0)

    def abs_bound(self) -> Optional[float]:
        """``max|scale · up @ down|`` ≤ ``|scale| · max‖up row‖ · max‖down column‖`` (Cauchy–Schwarz), grown by
        the float32 rounding of a rank-r dot product (``finite_bounds``)."""
        (up_norm, _), (down_norm, _) = self._longest
        return product_bound(up_norm, down_norm, self.rank, self.scale)

    @cached_property
    def _rough(self) -> Optional[float]:
        root = math.sqrt(self.rank)
        return product_bound(root * largest_abs(self.up), root * largest_abs(self.down), self.rank, self.scale)

    def rough_abs_bound(self) -> Optional[float]:
        """A looser bound from each factor's largest element (a row or column of r elements has a norm of at most
        √r times it): one pass per factor and no float32 copy, which proves a fuse far from its dtype's limit
        (``finite_bounds.proven_finite_for_any_weight``) without the norms of ``abs_bound``. Computed once per
        delta, like ``_longest``: every re-bind (a strength change, a switch back) asked it again, two passes per
        pair, which cost as much as a strength change's gemms on the 2-core bench machine (issue 47)."""
        return self._rough

    def peak_index(self) -> tuple:
        """Where the delta can be largest: the longest row of ``up`` against the longest column of ``down``."""
        (_, row), (_, column) = self._longest
        return row, column

    def value_at(self, row: int, column: int) -> tuple:
        """(the exact scaled delta at that element, a bound on the float32 rounding error of computing it)."""
        up = self.up.reshape(self.up.shape[0], -1)[row].double()
        down = self.down.reshape(self.rank, -1)[:, column].double()
        terms = up * down * float(self.scale)
        return float(terms.sum()), (rounding_growth(self.rank + 2) - 1.0) * float(terms.abs().sum())

    def gemm_factors(self, dtype) -> Optional[tuple]:
        """``(up, down)`` as matrices when both are stored in ``dtype`` (a linear layer's pair, not a conv's), for
        the patcher's one-gemm fuse in the weight's dtype; None otherwise (rounding a factor would change the
        delta)."""
        if self.up.dtype != dtype or self.down.dtype != dtype or self.down.dim() != 2 or self.up.dim() != 2:
            return None
        return self.up, self.down

    def sliced(self, dim: int, start: int, stop: int) -> "LowRankDelta":
        """The delta of rows (``dim`` 0: ``up``'s rows) or columns (``dim`` 1: ``down``'s columns) ``start:stop``
        of the weight: a tensor-parallel shard's own delta, computed from the same factor elements as the whole
        delta's same rows/columns (``binding.sharded_deltas``)."""
        if dim == 0:
            return replace(self, up=self.up[start:stop])
        return replace(self, down=self.down[:, start:stop])

    def row_adder(self, device, base_rows=None):
        up = self.up.to(device=device, dtype=torch.float32).reshape(self.up.shape[0], -1)
        down = self.down.to(device=device, dtype=torch.float32).reshape(self.down.shape[0], -1)
        scale = float(self.scale)

        def add(chunk, start, stop, strength):
            chunk.addmm_(up[start:stop], down, alpha=strength * scale)
        return add


def build(module: str, parts: dict, tensors, display_name: str, peft) -> LowRankDelta:
    for have, need in (("down", "up"), ("up", "down")):
        if have in parts and need not in parts:
            raise LoraFileError(f"{display_name}: {parts[have]!r} has no matching {need} factor "
                                f"(module {module!r} needs both lora_down/lora_A and lora_up/lora_B)")
    down, up = tensors[parts["down"]], tensors[parts["up"]]
    if down.dim() < 2 or up.dim() < 2 or up.shape[1] != down.shape[0]:
        raise LoraFileError(f"{display_name}: factors of module {module!r} do not chain: {parts['down']!r} "
                            f"{tuple(down.shape)} and {parts['up']!r} {tuple(up.shape)} (need up[:, r] and "
                            f"down[r, ...] with the same rank r)")
    rank = int(down.shape[0])
    if rank < 1:
        raise LoraFileError(f"{display_name}: {parts['down']!r} has rank 0 (an empty LoRA factor)")
    alpha = alpha_of(parts, tensors, display_name, module)
    if alpha is not None:
        rslora = bool(peft and peft.use_rslora)
    elif peft is not None:
        declared_rank, alpha = peft.rank_and_alpha(module)
        if declared_rank != rank:
            raise LoraFileError(f"{display_name}: adapter config gives module {module!r} rank {declared_rank} but "
                                f"{parts['down']!r} has rank {rank}")
        if not math.isfinite(alpha):
            raise LoraFileError(f"{display_name}: alpha of module {module!r} is not finite ({alpha})")
        rslora = peft.use_rslora
    else:
        return LowRankDelta(down=down, up=up, alpha=None, scale=1.0)
    scale = alpha / math.sqrt(rank) if rslora else alpha / rank
    return LowRankDelta(down=down, up=up, alpha=alpha, scale=scale)


def _peft_config(target_modules: str, with_bias: bool, settings: tuple):
    from peft import LoraConfig

    rank = dict(settings)["r"]
    kwargs = dict(r=rank, lora_alpha=rank, target_modules=target_modules, lora_dropout=0.0,
                  init_lora_weights=False)  # the weights are set right after injection
    if with_bias:
        if "lora_bias" not in getattr(LoraConfig, "__dataclass_fields__", {}):
            raise ValueError("it has bias diffs (diff_b); attaching them unfused needs peft >= 0.14 (lora_bias)")
        kwargs["lora_bias"] = True
    return LoraConfig(**kwargs)


def _peft_tensors(module_path: str, delta: LowRankDelta) -> dict:
    """peft's lora_A/lora_B with ``B' = scale · up``: peft at ``lora_alpha = r`` (scaling 1) then adds exactly
    the delta the fuse path applies."""
    if delta.down.dim() != 2:
        raise ValueError(f"'{module_path}' is a convolution LoRA (down {list(delta.down.shape)}); unfused adapters "
                         "support linear layers only")
    return {f"{module_path}.lora_A.weight": delta.down.to(torch.float32),
            f"{module_path}.lora_B.weight": delta.up.to(torch.float32) * float(delta.scale)}, (("r", delta.rank),)


# (suffix, part); a more specific spelling comes before a shorter one that could also end the same key
KIND = AdapterKind(
    name="lora",
    suffix_parts=(
        (".lora_A.default.weight", "down"),
        (".lora_B.default.weight", "up"),
        (".lora_down.weight", "down"),
        (".lora_up.weight", "up"),
        (".lora.down.weight", "down"),
        (".lora.up.weight", "up"),
        ("_lora.down.weight", "down"),  # old diffusers attention processor: "...processor.to_q_lora.down.weight"
        ("_lora.up.weight", "up"),
        (".lora_A.weight", "down"),
        (".lora_B.weight", "up"),
        (".lora_linear_layer.down.weight", "down"),  # old diffusers LoRALinearLayer (transformers-style)
        (".lora_linear_layer.up.weight", "up"),
        (".lora_A", "down"),  # Mochi-style factors without ".weight" (listed by LightX2V's loader)
        (".lora_B", "up"),
    ),
    build=build,
    peft_form=PeftForm(config=_peft_config, tensors=_peft_tensors, bias_key="lora_B.bias"),
)
