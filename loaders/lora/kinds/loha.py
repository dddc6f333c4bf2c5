"""LoHa (LyCORIS "Hadamard product" adapter): ``delta W = (w1a @ w1b) ⊙ (w2a @ w2b) · alpha / rank``.

Facts from LyCORIS (``lycoris/modules/loha.py``) and ComfyUI ``comfy/weight_adapter/loha.py``: the keys are
``<module>.hada_w1_a`` [out, r], ``.hada_w1_b`` [r, in·k], ``.hada_w2_a`` [out, r], ``.hada_w2_b`` [r, in·k],
an optional ``.alpha``; the scale is ``alpha / r`` with ``r = hada_w1_b.shape[0]`` and 1.0 without alpha.
Tucker cores (``hada_t1``/``hada_t2``, conv only) are refused with a message: not supported here yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ...errors import LoraFileError
from .base import AdapterKind, alpha_of, flat_shape, require

_FACTORS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")


@dataclass
class LohaDelta:
    w1a: Any
    w1b: Any
    w2a: Any
    w2b: Any
    alpha: Optional[float]
    scale: float
    kind: str = "loha"

    @property
    def rank(self) -> int:
        return int(self.w1b.shape[0])

    def delta_shape(self, weight_shape: tuple) -> Optional[tuple]:
        return flat_shape(int(self.w1a.shape[0]), int(self.w1b[0].numel()), weight_shape)

    def tensors(self) -> list:
        return [self.w1a, self.w1b, self.w2a, self.w2b]

    def row_adder(self, device):
        w1a, w1b, w2a, w2b = (t.to(device=device, dtype=torch.float32).reshape(t.shape[0], -1)
                              for t in self.tensors())

        def add(chunk, start, stop, alpha):
            chunk.add_((w1a[start:stop] @ w1b) * (w2a[start:stop] @ w2b), alpha=alpha)
        return add


def build(module: str, parts: dict, tensors, display_name: str, peft) -> LohaDelta:
    if "hada_t1" in parts or "hada_t2" in parts:
        raise LoraFileError(f"{display_name}: LoHa module {module!r} uses Tucker cores (hada_t1/hada_t2), which "
                            f"lorabind does not support yet")
    require(parts, _FACTORS, display_name, module, "LoHa")
    w1a, w1b, w2a, w2b = (tensors[parts[p]] for p in _FACTORS)
    if not (w1a.shape[1] == w1b.shape[0] and w2a.shape[1] == w2b.shape[0] and w1a.shape[0] == w2a.shape[0]
            and w1b[0].numel() == w2b[0].numel()):
        raise LoraFileError(f"{display_name}: LoHa factors of module {module!r} do not chain: "
                            f"{[tuple(tensors[parts[p]].shape) for p in _FACTORS]}")
    alpha = alpha_of(parts, tensors, display_name, module)
    rank = int(w1b.shape[0])
    return LohaDelta(w1a, w1b, w2a, w2b, alpha, 1.0 if alpha is None else alpha / rank)


KIND = AdapterKind(
    name="loha",
    suffix_parts=tuple((f".{p}", p) for p in (*_FACTORS, "hada_t1", "hada_t2")),
    build=build,
)
