"""The one interface every adapter kind implements, and the helpers kinds share.

An adapter kind (low-rank pair, LoHa, LoKr, ...) is one file in this package with one ``AdapterKind`` object:
it names the key suffixes it claims (suffix -> part), builds the per-module weight delta from a module's parts,
and the delta it builds computes its own rows in float32 for the patcher. Reading, accounting, the patcher and
``inspect`` only talk to this interface, so adding a kind is that file plus one line in ``kinds/__init__.py``
(or a ``register`` call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from ...errors import LoraFileError

if TYPE_CHECKING:
    import torch

# add(chunk, start, stop, strength): chunk is float32 [rows, cols], rows ``start:stop`` of the weight (flattened
# to 2-D); the kind adds ``strength`` times its (scaled) delta's rows
RowAdder = Callable[..., None]
# base_rows(start, stop): float32 rows ``start:stop`` of the UNPATCHED weight (flattened to 2-D), on the device;
# base_rows.rows / base_rows.cols: that flattened shape
BaseRows = Callable[[int, int], "torch.Tensor"]


class WeightDelta(Protocol):
    """What a kind's ``build`` returns and ``TargetPatch.low_rank`` holds: one module's weight delta."""

    kind: str
    alpha: Optional[float]
    scale: float

    @property
    def rank(self) -> int: ...

    def delta_shape(self, weight_shape: tuple) -> Optional[tuple]:
        """The delta's shape in the weight's layout, None when it cannot be laid out like that weight."""

    def tensors(self) -> list:
        """The file tensors it holds (for cache sizes)."""

    def abs_bound(self) -> Optional[float]:
        """An upper bound of ``max |scale · delta|`` as the kind computes it in float32 (its rounding included),
        from the factors alone; None when the kind has no cheap bound or a float32 intermediate might overflow (the
        patcher then scans what it writes). Why: ``finite_bounds`` proves a fused weight finite without a pass
        over it."""

    def peak_index(self) -> Optional[tuple]:
        """``(row, column)`` of the delta (flattened to [out, -1]) where it is likely largest, None when the kind
        cannot say; where the patcher looks for an element that proves an overflow before writing."""

    def value_at(self, row: int, column: int) -> Optional[tuple]:
        """``(exact scaled delta at that element in float64, bound on the float32 rounding error of computing
        it)``; None when the kind cannot compute one element on its own."""

    def row_adder(self, device, base_rows: BaseRows) -> RowAdder:
        """A function ``add(chunk, start, stop, strength)`` doing ``chunk += strength * delta[start:stop]`` in
        float32 (``delta`` flattened to [out, -1], its ``scale`` included); the factors are converted once per
        call of ``row_adder``. ``base_rows`` reads the unpatched weight: a kind whose delta depends on it (DoRA)
        computes from the base, never from ``chunk``, which may already hold other LoRAs' contributions."""

    # Optional: ``rough_abs_bound() -> Optional[float]``, a looser bound than ``abs_bound`` that is cheaper to
    # compute; ``finite_bounds`` tries it first where a loose bound is enough.
    # Optional (a kind without it is always fused by ``row_adder``):
    # ``gemm_factors(dtype) -> Optional[(up, down)]``: the delta as ``scale · up @ down`` with both 2-D factors
    # already stored in ``dtype``, so the patcher may add it with one gemm in the weight's own dtype
    # (``binding.fused_rows``); None when a factor would have to be rounded to that dtype first.


@dataclass(frozen=True)
class PeftForm:
    """How a kind runs unfused as a peft adapter (``loaders.binding.peft_adapters``), where peft has a tuner for it.

    ``tensors(module_path, delta)`` -> ``(state, settings)``: that module's entries of the adapter's state dict
    (float32, the delta's scale folded in, so the tuner's own scaling is 1) and the tuner settings the module
    needs (a hashable tuple of config ``(name, value)`` pairs, the rank among them); modules with equal settings
    share one adapter. ``config(target_modules, with_bias, settings)``: that adapter's peft config. Both raise
    ``ValueError`` with the reason when the module or the installed peft cannot run it unfused.
    ``bias_key``: the state-dict suffix a bias diff on the module goes to; None when the tuner has no bias.
    """

    config: Callable
    tensors: Callable
    bias_key: Optional[str] = None


@dataclass(frozen=True)
class AdapterKind:
    """One adapter kind: the key suffixes it claims and how a module's parts become its ``WeightDelta``.

    ``build(module, parts, tensors, display_name, peft)``: ``parts`` maps part -> raw key (only this kind's parts
    and ``alpha``); ``peft`` is the file's ``PeftScaling`` or None. ``peft_form``: how a file of this kind runs
    unfused as a peft adapter (``loaders.binding.peft_adapters``), None when it must be fused.

    ``wraps``: the kind decorates another kind's delta (DoRA's magnitude on a low-rank pair, LoHa or LoKr). It
    wins over the other kinds when its parts are present; the module's remaining parts are built by their own
    kind first and passed to ``build(..., inner=delta)``.
    """

    name: str
    suffix_parts: tuple  # ((suffix, part), ...), more specific suffixes first
    build: Callable
    peft_form: Optional[PeftForm] = None
    wraps: bool = False

    @cached_property
    def parts(self) -> frozenset:
        """Computed once per kind: asked for every key of every file read (a frozen dataclass may cache it)."""
        return frozenset(part for _, part in self.suffix_parts)

    @property
    def peft_capable(self) -> bool:
        return self.peft_form is not None


def alpha_of(parts: dict, tensors, display_name: str, module: str) -> Optional[float]:
    """The module's ``.alpha`` scalar, None when the file has none; errors name the file and key."""
    if "alpha" not in parts:
        return None
    tensor = tensors[parts["alpha"]]
    if tensor.numel() != 1:
        raise LoraFileError(f"{display_name}: {parts['alpha']!r} must be a scalar, got shape {tuple(tensor.shape)}")
    alpha = float(tensor.reshape(()).item())
    if not math.isfinite(alpha):
        raise LoraFileError(f"{display_name}: alpha of module {module!r} is not finite ({alpha})")
    return alpha


def require(parts: dict, needed: tuple, display_name: str, module: str, kind: str) -> None:
    """Every part in ``needed`` must be present; the error names the file, module and the missing keys."""
    missing = [part for part in needed if part not in parts]
    if missing:
        have = ", ".join(repr(k) for k in parts.values())
        raise LoraFileError(f"{display_name}: {kind} module {module!r} ({have}) lacks its {', '.join(missing)} "
                            f"tensor(s)")


def flat_shape(out: int, cols: int, weight_shape: tuple) -> Optional[tuple]:
    """A delta computed as [out, cols] laid out like ``weight_shape`` (conv weights flatten their tail)."""
    if not weight_shape or int(weight_shape[0]) != out or math.prod(int(s) for s in weight_shape[1:]) != cols:
        return None
    return tuple(int(s) for s in weight_shape)
