"""LoHa (LyCORIS "Hadamard product" adapter): ``delta W = W1 ⊙ W2 · alpha / rank``.

Facts from LyCORIS (``lycoris/modules/loha.py``, ``lycoris/functional/loha.py``) and ComfyUI
``comfy/weight_adapter/loha.py`` (``LoHaAdapter.calculate_weight``):

- plain: ``W1 = hada_w1_a @ hada_w1_b`` with ``hada_w1_a`` [out, r] and ``hada_w1_b`` [r, in·k]; ``W2`` likewise;
- Tucker (conv layers trained with ``use_tucker``): ``hada_t1`` [r, r, *k] is a core, ``hada_w1_a`` is [r, out]
  and ``hada_w1_b`` [r, in]; ``W1 = einsum('i j k l, j r, i p -> p r k l', hada_t1, hada_w1_b, hada_w1_a)``
  (ComfyUI's spelling, 2-D kernels; LyCORIS ``make_weight_cp`` is the same contraction). Any number of kernel
  dimensions contracts the same way, so Conv3d weights are handled too;
- the scale is ``alpha / r`` with ``r = hada_w1_b.shape[0]`` in both layouts, 1.0 without alpha.

Tucker is computed as a low-rank product: ``W1 = hada_w1_aᵀ @ (hada_t1 ×_j hada_w1_b)``, so a chunk of rows needs
only ``hada_w1_a``'s columns for those rows and the patcher's one-layer memory bound holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Optional

import torch

from ...errors import LoraFileError
from ..finite_bounds import FLOAT32_MAX, largest_norm, product_bound, rounding_growth
from .base import AdapterKind, PeftForm, alpha_of, flat_shape, require

_FACTORS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")


@dataclass
class LohaDelta:
    w1a: Any
    w1b: Any
    w2a: Any
    w2b: Any
    alpha: Optional[float]
    scale: float
    t1: Any = None  # Tucker cores [r, r, *k] (both or neither)
    t2: Any = None
    kind: str = "loha"

    @property
    def rank(self) -> int:
        return int(self.w1b.shape[0])

    @property
    def tucker(self) -> bool:
        return self.t1 is not None

    def delta_shape(self, weight_shape: tuple) -> Optional[tuple]:
        if not self.tucker:
            return flat_shape(int(self.w1a.shape[0]), int(self.w1b[0].numel()), weight_shape)
        # Tucker: [out, in, *k] exactly (the kernel comes from the core, not from a flattened factor)
        shape = (int(self.w1a.shape[1]), int(self.w1b.shape[1]), *(int(s) for s in self.t1.shape[2:]))
        return shape if tuple(int(s) for s in weight_shape) == shape else None

    def tensors(self) -> list:
        return [self.w1a, self.w1b, self.w2a, self.w2b] + ([self.t1, self.t2] if self.tucker else [])

    def sliced(self, dim: int, start: int, stop: int) -> "LohaDelta":
        """Rows (``dim`` 0: both ``a`` factors' rows) or columns (``dim`` 1: both ``b`` factors' columns) of a
        linear layer's delta, for a tensor-parallel shard; a Tucker delta (convolutions, which no plan shards)
        raises ``ValueError`` with the reason."""
        if self.tucker or self.w1b.dim() != 2:
            raise ValueError("a Tucker or convolution LoHa delta is not split per rank")
        if dim == 0:
            return replace(self, w1a=self.w1a[start:stop], w2a=self.w2a[start:stop])
        return replace(self, w1b=self.w1b[:, start:stop], w2b=self.w2b[:, start:stop])

    def _pair(self, a, b, t, device) -> tuple:
        """(up [out, r], down [r, in·k]) in float32 of one Hadamard factor."""
        a, b = (x.to(device=device, dtype=torch.float32) for x in (a, b))
        if t is None:
            return a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
        core = torch.einsum("i j ..., j r -> i r ...", t.to(device=device, dtype=torch.float32), b)
        return a.t(), core.reshape(core.shape[0], -1)

    def _factor_bound(self, a, b, t) -> Optional[float]:
        """Bound of one Hadamard factor ``up @ down`` as ``_pair`` computes it (Cauchy–Schwarz on the rows of
        ``up`` and columns of ``down``; a Tucker core is bounded through its absolute values)."""
        if t is None:
            return product_bound(largest_norm(a, dim=1)[0], largest_norm(b, dim=0)[0], self.rank)
        core = torch.einsum("i j ..., j r -> i r ...", t.detach().abs().double(), b.detach().abs().double())
        down_norm = largest_norm(core, dim=0)[0] * rounding_growth(self.rank)
        return product_bound(largest_norm(a, dim=0)[0], down_norm, self.rank)

    @cached_property
    def _bound(self) -> Optional[float]:
        first = self._factor_bound(self.w1a, self.w1b, self.t1)
        second = self._factor_bound(self.w2a, self.w2b, self.t2)
        if first is None or second is None or not first * second <= FLOAT32_MAX:
            return None
        return abs(float(self.scale)) * first * second * rounding_growth(3)  # the product, the scale, the add

    def abs_bound(self) -> Optional[float]:
        """``|scale| · max|W1| · max|W2|`` with each factor bounded from its own pair (computed once per delta)."""
        return self._bound

    def peak_index(self):
        return None

    def value_at(self, row: int, column: int):
        return None

    def row_adder(self, device, base_rows=None):
        up1, down1 = self._pair(self.w1a, self.w1b, self.t1, device)
        up2, down2 = self._pair(self.w2a, self.w2b, self.t2, device)
        scale = float(self.scale)

        def add(chunk, start, stop, strength):
            chunk.add_((up1[start:stop] @ down1) * (up2[start:stop] @ down2), alpha=strength * scale)
        return add


def build(module: str, parts: dict, tensors, display_name: str, peft) -> LohaDelta:
    require(parts, _FACTORS, display_name, module, "LoHa")
    w1a, w1b, w2a, w2b = (tensors[parts[p]] for p in _FACTORS)
    shapes = [tuple(tensors[parts[p]].shape) for p in _FACTORS]
    alpha = alpha_of(parts, tensors, display_name, module)
    scale = 1.0 if alpha is None else alpha / int(w1b.shape[0])
    if "hada_t1" in parts or "hada_t2" in parts:
        require(parts, ("hada_t1", "hada_t2"), display_name, module, "LoHa (Tucker)")
        t1, t2 = tensors[parts["hada_t1"]], tensors[parts["hada_t2"]]
        ok = (t1.dim() >= 3 and t1.shape == t2.shape and all(w.dim() == 2 for w in (w1a, w1b, w2a, w2b))
              and w1a.shape[0] == w1b.shape[0] == t1.shape[0] and w2a.shape[0] == w2b.shape[0] == t2.shape[0]
              and t1.shape[1] == w1b.shape[0] and t2.shape[1] == w2b.shape[0]
              and w1a.shape[1] == w2a.shape[1] and w1b.shape[1] == w2b.shape[1])
        if not ok:
            raise LoraFileError(f"{display_name}: LoHa Tucker factors of module {module!r} do not chain: "
                                f"{shapes} with cores {tuple(t1.shape)}, {tuple(t2.shape)} (need hada_wN_a [r, out], "
                                f"hada_wN_b [r, in], hada_tN [r, r, *kernel])")
        return LohaDelta(w1a, w1b, w2a, w2b, alpha, scale, t1, t2)
    if not (w1a.shape[1] == w1b.shape[0] and w2a.shape[1] == w2b.shape[0] and w1a.shape[0] == w2a.shape[0]
            and w1b[0].numel() == w2b[0].numel()):
        raise LoraFileError(f"{display_name}: LoHa factors of module {module!r} do not chain: {shapes}")
    return LohaDelta(w1a, w1b, w2a, w2b, alpha, scale)


def _peft_config(target_modules: str, with_bias: bool, settings: tuple):
    from peft import LoHaConfig

    rank = dict(settings)["r"]
    # alpha = r: the scale is folded into hada_w1_a (the product is linear in each factor)
    return LoHaConfig(r=rank, alpha=rank, target_modules=target_modules, rank_dropout=0.0, module_dropout=0.0,
                      init_weights=False)


def _peft_tensors(module_path: str, delta: LohaDelta) -> dict:
    """peft's LoHa layer holds the same four factors for a Linear (``hada_w1_a`` [out, r], ``hada_w1_b`` [r, in])
    and adds ``(w1a @ w1b) * (w2a @ w2b) * scaling`` (peft/tuners/loha/layer.py)."""
    if delta.tucker or delta.w1b.dim() != 2:
        raise ValueError(f"'{module_path}' is a convolution LoHa; unfused adapters support linear layers only")
    factors = {"hada_w1_a": delta.w1a * float(delta.scale), "hada_w1_b": delta.w1b, "hada_w2_a": delta.w2a,
               "hada_w2_b": delta.w2b}
    return ({f"{module_path}.{name}": tensor.to(torch.float32) for name, tensor in factors.items()},
            (("r", delta.rank),))


KIND = AdapterKind(
    name="loha",
    suffix_parts=tuple((f".{p}", p) for p in (*_FACTORS, "hada_t1", "hada_t2")),
    build=build,
    peft_form=PeftForm(config=_peft_config, tensors=_peft_tensors),
)
