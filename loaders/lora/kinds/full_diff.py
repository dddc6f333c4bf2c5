"""Full diffs: a tensor the size of the parameter it changes, ``delta = strength · diff`` (no factors, no scale).

The suffixes (LightX2V/ComfyUI): ``<module>.diff`` (the module's weight), ``.diff_b`` (its bias), Wan's
``blocks.N.diff_m`` (the block's modulation table) and PEFT's ``lora_B.bias`` (``lora_bias=True``: a bias delta,
which the assembly scales like its pair). Unlike the other kinds a full diff targets a named PARAMETER, not the
module's weight, so a module may carry several (``PARAMETER_OF_PART``); the patcher sees them as ``FullDiff``
deltas like any other kind's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Optional

import torch

from ..finite_bounds import FLOAT32_MAX, largest_abs, rounding_growth
from .base import AdapterKind

# part -> the module parameter it changes ("modulation" is renamed by the family, e.g. Wan's scale_shift_table)
PARAMETER_OF_PART = {"weight": "weight", "bias": "bias", "modulation": "modulation"}


@dataclass
class FullDiff:
    tensor: Any
    kind: str = "diff"
    alpha: Optional[float] = None
    scale: float = 1.0

    @property
    def rank(self) -> int:
        return 0

    def delta_shape(self, weight_shape: tuple) -> Optional[tuple]:
        """The diff's own shape: the caller compares it with the parameter's (a mismatch names both)."""
        return tuple(int(s) for s in self.tensor.shape)

    def tensors(self) -> list:
        return [self.tensor]

    def _rows(self) -> torch.Tensor:
        return self.tensor.reshape(int(self.tensor.shape[0]) if self.tensor.dim() else 1, -1)

    @cached_property
    def _bound(self) -> Optional[float]:
        largest = largest_abs(self.tensor)
        return largest * rounding_growth(2) if largest <= FLOAT32_MAX else None

    def abs_bound(self) -> Optional[float]:
        """``max|diff|``, grown by the float32 conversion and ``strength ·`` (one pass over the diff per delta,
        however often the finite proofs ask: a bias is small, a full weight diff is as large as its weight)."""
        return self._bound

    def peak_index(self) -> Optional[tuple]:
        if self.tensor.numel() == 0:
            return None
        rows = self._rows()
        flat = int(rows.abs().argmax())
        return divmod(flat, int(rows.shape[1]))

    def value_at(self, row: int, column: int) -> tuple:
        value = float(self._rows()[row, column])
        return value, abs(value) * (rounding_growth(2) - 1.0)

    def sliced(self, dim: int, start: int, stop: int) -> "FullDiff":
        """Rows (``dim`` 0) or columns (``dim`` 1) ``start:stop`` of the diff: a tensor-parallel shard's own diff."""
        return replace(self, tensor=self.tensor.narrow(dim, start, stop - start))

    def row_adder(self, device, base_rows):
        rows = self.tensor.reshape(base_rows.rows, -1)

        def add(chunk, start, stop, strength):
            chunk.add_(rows[start:stop].to(device=device, dtype=torch.float32), alpha=strength)
        return add


def build(module: str, parts: dict, tensors, display_name: str, peft) -> dict:
    """{parameter: FullDiff} of one module's full-diff parts."""
    return {PARAMETER_OF_PART[part]: FullDiff(tensors[key]) for part, key in parts.items()
            if part in PARAMETER_OF_PART}


KIND = AdapterKind(
    name="diff",
    suffix_parts=(
        (".lora_B.default.bias", "bias"),
        (".lora_B.bias", "bias"),  # PEFT lora_bias=True: a plain additive bias delta
        (".diff_b", "bias"),
        (".diff_m", "modulation"),
        (".diff", "weight"),
    ),
    build=build,
)
