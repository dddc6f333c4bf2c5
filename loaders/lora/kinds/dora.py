"""DoRA (weight-decomposed LoRA): a magnitude vector on top of another kind's delta.

``W' = m · (W + ΔW) / ‖W + ΔW‖``, where ``ΔW`` is the inner kind's scaled delta (a low-rank pair, or LoHa/LoKr
as ComfyUI also allows) and the norm is taken per output row or per input column:

- PEFT (``use_dora=True``; ``<module>.lora_magnitude_vector``, shape [out] for linear, [1, out, 1, 1] for conv):
  per OUTPUT channel, the norm over the rest of the weight (``peft/tuners/lora/dora.py``,
  ``DoraLinearLayer.get_weight_norm``: ``linalg.norm(W + scaling·B@A, dim=1)``; merge:
  ``magnitude / norm · (W + ΔW)``, no epsilon);
- kohya/LyCORIS (``<module>.dora_scale``): its shape tells the axis, the rule ComfyUI uses
  (``comfy/weight_adapter/base.py: weight_decompose``): ``dora_scale.shape[0] == out`` (LyCORIS ``wd_on_out``,
  [out, 1, ...]) is per output row; otherwise ([1, in, 1, ...], kohya's default) per INPUT channel, the norm over
  the output rows (and the kernel). ComfyUI's output-axis branch takes the norm of the base weight alone and adds
  ``finfo.eps``; we follow peft and the DoRA paper (norm of ``W + ΔW``, no epsilon) so a file fused here matches
  peft's own ``merge_and_unload``.
- strength ``s``: ``W + s · (W' - W)`` (ComfyUI's rule); strength 1 is exactly ``W'``.

Order relative to other fuses: a DoRA delta is ALWAYS computed from the unpatched base weight ``W`` (the
patcher's ``base_rows``), never from a weight that already holds other LoRAs, and then added like any other
delta: ``W0 + Σ sᵢ·Δᵢ``. So stacking a DoRA with other LoRAs on one weight is order-independent, and switching any
of them re-computes exactly; it equals applying each DoRA alone to the base and summing the changes (ComfyUI, by
contrast, normalises whatever weight its patch chain has reached, which depends on the order).

Per-row norms need only the chunk's rows; per-column norms need every row, so that mode makes one extra pass over
the base in row chunks (sums of squares per column) before the rows are written: memory stays one chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import LoraFileError
from .base import AdapterKind

_PASS_BYTES = 8 * 1024 * 1024  # float32 rows per chunk of the column-norm pass (as the patcher's chunks)


@dataclass
class DoraDelta:
    inner: Any  # the decomposed kind's WeightDelta
    magnitude: Any
    peft_axis: bool  # PEFT's magnitude: always per output channel; kohya's dora_scale: its shape tells
    kind: str = "dora"
    # why a tensor-parallel shard refuses it (``binding.sharded_deltas``): the magnitude divides by a norm over
    # the whole weight (rows or columns), which one rank's shard does not hold without a cross-rank reduction
    shard_refusal = "its norm is taken over the whole weight, which a shard would need a cross-rank reduction for"

    @property
    def alpha(self):
        return self.inner.alpha

    @property
    def scale(self) -> float:
        return self.inner.scale

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def inner_kind(self) -> str:
        return self.inner.kind

    def on_output_axis(self, rows: int) -> bool:
        return self.peft_axis or int(self.magnitude.shape[0]) == rows

    def delta_shape(self, weight_shape: tuple):
        shape = self.inner.delta_shape(weight_shape)
        if shape is None or len(shape) < 2:
            return None
        if self.magnitude.numel() != int(shape[0] if self.on_output_axis(int(shape[0])) else shape[1]):
            return None
        return shape

    def tensors(self) -> list:
        return [*self.inner.tensors(), self.magnitude]

    def abs_bound(self):
        """None: the normalisation divides by ``‖W + ΔW‖``, which a bound on the factors does not keep away from 0
        (a zero row gives NaN), so a DoRA parameter's written chunks are scanned."""
        return None

    def peak_index(self):
        return None

    def value_at(self, row: int, column: int):
        return None

    def row_adder(self, device, base_rows):
        inner = self.inner.row_adder(device, base_rows)
        magnitude = self.magnitude.to(device=device, dtype=torch.float32).reshape(-1)

        def adapted(start, stop):
            """(W, W + ΔW) rows of the base, in float32."""
            base = base_rows(start, stop)
            changed = base.clone()
            inner(changed, start, stop, 1.0)
            return base, changed

        if self.on_output_axis(base_rows.rows):
            def add(chunk, start, stop, strength):
                base, changed = adapted(start, stop)
                factor = magnitude[start:stop, None] / torch.linalg.vector_norm(changed, dim=1, keepdim=True)
                chunk.add_(changed * factor - base, alpha=strength)
            return add

        factor = magnitude.repeat_interleave(base_rows.cols // magnitude.numel()) / self._column_norms(adapted,
                                                                                                      base_rows)

        def add(chunk, start, stop, strength):
            base, changed = adapted(start, stop)
            chunk.add_(changed * factor - base, alpha=strength)
        return add

    def _column_norms(self, adapted, base_rows):
        """‖W + ΔW‖ per input channel (over every row and the kernel), spread back over the flattened columns."""
        rows, cols = base_rows.rows, base_rows.cols
        squares = None
        step = max(1, _PASS_BYTES // (4 * max(1, cols)))
        for start in range(0, rows, step):
            _, changed = adapted(start, min(rows, start + step))
            part = changed.square().sum(dim=0)
            squares = part if squares is None else squares + part
        kernel = cols // self.magnitude.numel()
        return squares.view(-1, kernel).sum(dim=1).sqrt().repeat_interleave(kernel)


def build(module: str, parts: dict, tensors, display_name: str, peft, *, inner) -> DoraDelta:
    """``parts`` holds this kind's own part (``magnitude`` or ``dora_scale``); ``inner`` is the decomposed delta."""
    if "magnitude" in parts and "dora_scale" in parts:
        raise LoraFileError(f"{display_name}: module {module!r} has both {parts['magnitude']!r} and "
                            f"{parts['dora_scale']!r}; one DoRA magnitude per module")
    key = parts.get("magnitude") or parts["dora_scale"]
    magnitude = tensors[key]
    if magnitude.numel() < 1 or math.prod(magnitude.shape) != max(magnitude.shape):
        raise LoraFileError(f"{display_name}: DoRA magnitude {key!r} has shape {tuple(magnitude.shape)}; it must "
                            f"be a vector (one value per output or input channel)")
    if not bool(torch.isfinite(magnitude).all()):
        raise LoraFileError(f"{display_name}: DoRA magnitude {key!r} is not finite")
    return DoraDelta(inner, magnitude, peft_axis="magnitude" in parts)


KIND = AdapterKind(
    name="dora",
    suffix_parts=(
        (".lora_magnitude_vector.default.weight", "magnitude"),  # PEFT in memory (DiffSynth-style saves)
        (".lora_magnitude_vector.weight", "magnitude"),
        (".lora_magnitude_vector", "magnitude"),  # PEFT's saved adapter_model.safetensors
        (".dora_scale", "dora_scale"),  # kohya / LyCORIS
    ),
    build=build,
    wraps=True,
)
