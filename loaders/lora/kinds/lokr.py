"""LoKr (LyCORIS Kronecker adapter): ``delta W = kron(w1, w2) · scale``.

Facts from LyCORIS (``lycoris/modules/lokr.py``) and ComfyUI ``comfy/weight_adapter/lokr.py``: ``w1`` is a full
``<module>.lokr_w1`` [a, b] or the product ``lokr_w1_a @ lokr_w1_b``; ``w2`` likewise (``lokr_w2`` [c, d] or
``lokr_w2_a @ lokr_w2_b``). The scale is ``alpha / dim`` only when a factor is factored (``dim`` = the rank of the
factored one, w2's when both are) and 1.0 when both are full matrices or there is no alpha. Tucker cores
(``lokr_t2``) and 4-D conv factors are refused with a message: not supported here yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ...errors import LoraFileError
from .base import AdapterKind, alpha_of, flat_shape


@dataclass
class LokrDelta:
    w1: tuple  # (full,) or (a, b)
    w2: tuple
    alpha: Optional[float]
    scale: float
    kind: str = "lokr"

    @property
    def rank(self) -> int:
        """The rank of the factored part (w2's when both are factored), 0 when both factors are full."""
        for factor in (self.w2, self.w1):
            if len(factor) == 2:
                return int(factor[1].shape[0])
        return 0

    def _dims(self) -> tuple:
        rows1, cols1 = int(self.w1[0].shape[0]), int(self.w1[-1].shape[1])
        rows2, cols2 = int(self.w2[0].shape[0]), int(self.w2[-1].shape[1])
        return rows1, cols1, rows2, cols2

    def delta_shape(self, weight_shape: tuple) -> Optional[tuple]:
        rows1, cols1, rows2, cols2 = self._dims()
        return flat_shape(rows1 * rows2, cols1 * cols2, weight_shape)

    def tensors(self) -> list:
        return [*self.w1, *self.w2]

    def row_adder(self, device):
        def full(factor):
            mats = [t.to(device=device, dtype=torch.float32) for t in factor]
            return mats[0] if len(mats) == 1 else mats[0] @ mats[1]
        w1, w2 = full(self.w1), full(self.w2)
        rows2 = w2.shape[0]

        def add(chunk, start, stop, alpha):
            # row r of kron(w1, w2) is the outer product of w1[r // c] and w2[r % c], flattened (c = rows of w2)
            rows = torch.arange(start, stop, device=device)
            block = w1[rows // rows2][:, :, None] * w2[rows % rows2][:, None, :]
            chunk.add_(block.reshape(stop - start, -1), alpha=alpha)
        return add


def _factor(parts, tensors, display_name, module, which) -> tuple:
    full, a, b = f"lokr_{which}", f"lokr_{which}_a", f"lokr_{which}_b"
    if full in parts:
        factor = (tensors[parts[full]],)
    elif a in parts and b in parts:
        factor = (tensors[parts[a]], tensors[parts[b]])
        if factor[0].dim() != 2 or factor[1].dim() != 2 or factor[0].shape[1] != factor[1].shape[0]:
            raise LoraFileError(f"{display_name}: {parts[a]!r} {tuple(factor[0].shape)} and {parts[b]!r} "
                                f"{tuple(factor[1].shape)} do not chain")
    else:
        raise LoraFileError(f"{display_name}: LoKr module {module!r} needs {full} or both {a} and {b}")
    if any(t.dim() != 2 for t in factor):
        raise LoraFileError(f"{display_name}: LoKr module {module!r} has a {factor[0].dim()}-D {which} factor; "
                            f"only 2-D (linear) LoKr factors are supported")
    return factor


def build(module: str, parts: dict, tensors, display_name: str, peft) -> LokrDelta:
    if "lokr_t2" in parts:
        raise LoraFileError(f"{display_name}: LoKr module {module!r} uses a Tucker core (lokr_t2), which lorabind "
                            f"does not support yet")
    w1 = _factor(parts, tensors, display_name, module, "w1")
    w2 = _factor(parts, tensors, display_name, module, "w2")
    alpha = alpha_of(parts, tensors, display_name, module)
    dim = int(w2[1].shape[0]) if len(w2) == 2 else int(w1[1].shape[0]) if len(w1) == 2 else None
    scale = alpha / dim if alpha is not None and dim is not None else 1.0
    return LokrDelta(w1, w2, alpha, scale)


KIND = AdapterKind(
    name="lokr",
    suffix_parts=tuple((f".{p}", p) for p in ("lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b", "lokr_t2",
                                               "lokr_w1", "lokr_w2")),
    build=build,
)
