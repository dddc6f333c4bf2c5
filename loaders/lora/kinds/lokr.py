"""LoKr (LyCORIS Kronecker adapter): ``delta W = kron(w1, w2) · scale``.

Facts from LyCORIS (``lycoris/modules/lokr.py``) and ComfyUI ``comfy/weight_adapter/lokr.py``
(``LoKrAdapter.calculate_weight``):

- ``w1`` is a full ``<module>.lokr_w1`` [a, b] or the product ``lokr_w1_a @ lokr_w1_b``;
- ``w2`` is a full ``lokr_w2`` ([c, d], conv: [c, d, *k]), the product ``lokr_w2_a @ lokr_w2_b`` (conv: ``lokr_w2_b``
  is [r, d·k]), or with a Tucker core ``lokr_t2`` [r, r, *k]:
  ``w2 = einsum('i j k l, j r, i p -> p r k l', lokr_t2, lokr_w2_b, lokr_w2_a)`` (``lokr_w2_a`` [r, c],
  ``lokr_w2_b`` [r, d]);
- a conv delta is ``kron(w1[:, :, None, None], w2)``, which flattened to [a·c, b·d·k] equals the 2-D
  ``kron(w1, w2 flattened to [c, d·k])``, so one row rule serves linear and conv weights;
- the scale is ``alpha / dim`` where ``dim`` is the rank of the factored factor (``lokr_w2_b.shape[0]`` when w2 is
  factored, else ``lokr_w1_b.shape[0]``), and 1.0 when both are full matrices or there is no alpha (checked
  against ComfyUI's ``calculate_weight``; LyCORIS sets ``alpha = lora_dim`` when both are full, scale 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import torch

from ...errors import LoraFileError
from ..finite_bounds import FLOAT32_MAX, largest_abs, largest_norm, product_bound, rounding_growth
from .base import AdapterKind, PeftForm, alpha_of, flat_shape


@dataclass
class LokrDelta:
    w1: tuple  # (full,) or (a, b)
    w2: tuple  # (full,), (a, b) or (a, b, core) with a Tucker core
    alpha: Optional[float]
    scale: float
    kind: str = "lokr"
    # why a tensor-parallel shard refuses it (``binding.sharded_deltas``): a shard's rows or columns cut across
    # the Kronecker blocks, so no slice of the two factors is the shard's delta
    shard_refusal = "its Kronecker factors do not split at a shard's row or column boundary"

    @property
    def rank(self) -> int:
        """The rank of the factored part (w2's when both are factored), 0 when both factors are full."""
        for factor in (self.w2, self.w1):
            if len(factor) >= 2:
                return int(factor[1].shape[0])
        return 0

    def _w2_dims(self) -> tuple:
        """(rows of w2, its columns flattened, its kernel shape or None when it does not carry one)."""
        if len(self.w2) == 3:
            a, b, core = self.w2
            kernel = tuple(int(s) for s in core.shape[2:])
            return int(a.shape[1]), int(b.shape[1]) * math.prod(kernel), kernel
        if len(self.w2) == 2:
            return int(self.w2[0].shape[0]), int(self.w2[1][0].numel()), None
        full = self.w2[0]
        return int(full.shape[0]), int(full[0].numel()), tuple(int(s) for s in full.shape[2:]) or None

    def delta_shape(self, weight_shape: tuple) -> Optional[tuple]:
        rows1, cols1 = int(self.w1[0].shape[0]), int(self.w1[-1].shape[1])
        rows2, cols2, kernel = self._w2_dims()
        if kernel is not None and tuple(int(s) for s in weight_shape[2:]) != kernel:
            return None
        return flat_shape(rows1 * rows2, cols1 * cols2, weight_shape)

    def tensors(self) -> list:
        return [*self.w1, *self.w2]

    def _w2_matrix(self, device) -> torch.Tensor:
        mats = [t.to(device=device, dtype=torch.float32) for t in self.w2]
        if len(mats) == 3:
            a, b, core = mats
            w2 = torch.einsum("i j ..., j r, i p -> p r ...", core, b, a)
        elif len(mats) == 2:
            w2 = mats[0].reshape(mats[0].shape[0], -1) @ mats[1].reshape(mats[1].shape[0], -1)
        else:
            w2 = mats[0]
        return w2.reshape(w2.shape[0], -1)

    @staticmethod
    def _matrix_bound(factor: tuple) -> Optional[float]:
        """``max|w|`` of one Kronecker factor as the kind computes it: exact for a full matrix, Cauchy–Schwarz for
        a product, the absolute values through a Tucker core (``r²`` terms of three factors)."""
        if len(factor) == 1:
            return largest_abs(factor[0])
        if len(factor) == 2:
            a, b = factor
            return product_bound(largest_norm(a, dim=1)[0], largest_norm(b, dim=0)[0], int(b.shape[0]))
        a, b, core = (t.detach().abs().double() for t in factor)
        rank = int(core.shape[0])
        return float(torch.einsum("i j ..., j r, i p -> p r ...", core, b, a).max()) * rounding_growth(rank * rank + 2)

    @cached_property
    def _bound(self) -> Optional[float]:
        first, second = self._matrix_bound(self.w1), self._matrix_bound(self.w2)
        if first is None or second is None or not max(first, second, first * second) <= FLOAT32_MAX:
            return None
        return abs(float(self.scale)) * first * second * rounding_growth(3)  # the product, the scale, the add

    def abs_bound(self) -> Optional[float]:
        """``|scale| · max|w1| · max|w2|`` (every element of a Kronecker product is one product of the two),
        computed once per delta."""
        return self._bound

    def peak_index(self):
        return None

    def value_at(self, row: int, column: int):
        return None

    def row_adder(self, device, base_rows=None):
        mats = [t.to(device=device, dtype=torch.float32) for t in self.w1]
        w1 = mats[0] if len(mats) == 1 else mats[0] @ mats[1]
        w2 = self._w2_matrix(device)
        rows2 = w2.shape[0]
        scale = float(self.scale)

        def add(chunk, start, stop, strength):
            # row r of kron(w1, w2) is the outer product of w1[r // c] and w2[r % c], flattened (c = rows of w2)
            rows = torch.arange(start, stop, device=device)
            block = w1[rows // rows2][:, :, None] * w2[rows % rows2][:, None, :]
            chunk.add_(block.reshape(stop - start, -1), alpha=strength * scale)
        return add


def _factor(parts, tensors, display_name, module, which) -> tuple:
    full, a, b = f"lokr_{which}", f"lokr_{which}_a", f"lokr_{which}_b"
    if full in parts:
        factor = (tensors[parts[full]],)
        if factor[0].dim() < 2 or (which == "w1" and factor[0].dim() != 2):
            raise LoraFileError(f"{display_name}: {parts[full]!r} has shape {tuple(factor[0].shape)}; LoKr {which} "
                                f"must be a {'2-D' if which == 'w1' else '2-D (or conv)'} matrix")
        return factor
    if not (a in parts and b in parts):
        raise LoraFileError(f"{display_name}: LoKr module {module!r} needs {full} or both {a} and {b}")
    fa, fb = tensors[parts[a]], tensors[parts[b]]
    if which == "w2" and "lokr_t2" in parts:
        core = tensors[parts["lokr_t2"]]
        if not (fa.dim() == 2 and fb.dim() == 2 and core.dim() >= 3 and fa.shape[0] == core.shape[0]
                and fb.shape[0] == core.shape[1]):
            raise LoraFileError(f"{display_name}: LoKr Tucker factors of module {module!r} do not chain: "
                                f"{parts[a]!r} {tuple(fa.shape)}, {parts[b]!r} {tuple(fb.shape)}, "
                                f"{parts['lokr_t2']!r} {tuple(core.shape)} (need [r, c], [r, d], [r, r, *kernel])")
        return fa, fb, core
    if fa.dim() != 2 or fb.dim() < 2 or fa.shape[1] != fb.shape[0] or (which == "w1" and fb.dim() != 2):
        raise LoraFileError(f"{display_name}: {parts[a]!r} {tuple(fa.shape)} and {parts[b]!r} "
                            f"{tuple(fb.shape)} do not chain")
    return fa, fb


def build(module: str, parts: dict, tensors, display_name: str, peft) -> LokrDelta:
    if "lokr_t2" in parts and "lokr_w2" in parts:
        raise LoraFileError(f"{display_name}: LoKr module {module!r} has both a full lokr_w2 and a Tucker core "
                            f"lokr_t2 ({parts['lokr_t2']!r}); the core belongs to a factored lokr_w2_a/lokr_w2_b")
    w1 = _factor(parts, tensors, display_name, module, "w1")
    w2 = _factor(parts, tensors, display_name, module, "w2")
    alpha = alpha_of(parts, tensors, display_name, module)
    dim = int(w2[1].shape[0]) if len(w2) >= 2 else int(w1[1].shape[0]) if len(w1) == 2 else None
    scale = alpha / dim if alpha is not None and dim is not None else 1.0
    return LokrDelta(w1, w2, alpha, scale)


def _peft_tensors(module_path: str, delta: LokrDelta) -> tuple:
    """peft's LoKr layer for a Linear holds ``lokr_w1`` (or ``lokr_w1_a``/``_b``) and ``lokr_w2`` (or
    ``lokr_w2_a``/``_b``) and adds ``kron(w1, w2) * alpha / r`` (peft/tuners/lokr/layer.py). It shapes them itself:
    ``factorization(dim, decompose_factor)`` of each dimension, w2 full when ``r >= max(w2 dims) / 2``, w1 factored
    only with ``decompose_both`` and ``r < max(w1 dims) / 2`` (LyCORIS uses the same rules). The settings reproduce
    the file's own shapes, or the module is refused naming them."""
    from peft.tuners.lokr.layer import factorization

    if len(delta.w2) == 3 or delta.w2[-1].dim() != 2:
        raise ValueError(f"'{module_path}' is a convolution LoKr; unfused adapters support linear layers only")
    a, b = int(delta.w1[0].shape[0]), int(delta.w1[-1].shape[1])
    c, d = int(delta.w2[0].shape[0]), int(delta.w2[-1].shape[1])
    factor = next((f for f in (-1, a, b, c, d) if factorization(a * c, f) == (a, c)
                   and factorization(b * d, f) == (b, d)), None)
    w1_factored, w2_factored = len(delta.w1) == 2, len(delta.w2) == 2
    rank = delta.rank or max(c, d)  # both factors full: any r >= max(c, d) / 2 keeps peft's w2 full
    fits = (factor is not None and w2_factored == (rank < max(c, d) / 2)
            and (not w1_factored or rank < max(a, b) / 2)
            and (not (w1_factored and w2_factored) or int(delta.w1[1].shape[0]) == rank))
    if not fits:
        raise ValueError(f"'{module_path}': its Kronecker factors ({a}x{b} ⊗ {c}x{d}, rank {delta.rank}) are not a "
                         "split peft's LoKr tuner makes")
    scale = float(delta.scale)
    names = ("lokr_w1_a", "lokr_w1_b") if w1_factored else ("lokr_w1",)
    state = {name: t * (scale if i == 0 else 1.0) for i, (name, t) in enumerate(zip(names, delta.w1))}
    state.update(zip(("lokr_w2_a", "lokr_w2_b") if w2_factored else ("lokr_w2",), delta.w2))
    settings = (("r", rank), ("decompose_factor", factor), ("decompose_both", w1_factored))
    return {f"{module_path}.{name}": t.to(torch.float32) for name, t in state.items()}, settings


def _peft_config(target_modules: str, with_bias: bool, settings: tuple):
    from peft import LoKrConfig

    options = dict(settings)
    # alpha = r: the scale is folded into w1 (the Kronecker product is linear in it)
    return LoKrConfig(r=options["r"], alpha=options["r"], target_modules=target_modules, rank_dropout=0.0,
                      module_dropout=0.0, init_weights=False, decompose_factor=options["decompose_factor"],
                      decompose_both=options["decompose_both"])


KIND = AdapterKind(
    name="lokr",
    suffix_parts=tuple((f".{p}", p) for p in ("lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b", "lokr_t2",
                                               "lokr_w1", "lokr_w2")),
    build=build,
    peft_form=PeftForm(config=_peft_config, tensors=_peft_tensors),
)
