"""Proving that a fused weight stays finite without a second pass over it (issue 33).

A fuse computes ``W + Σ s·Δ`` in float32 and rounds it once to the parameter's dtype; a finite original must
never become Inf or NaN (finite factors can still overflow: ``1e19 · 1e19`` is past bfloat16's range). Scanning
every written chunk for non-finite values cost as much as the fuse's matmuls, so the patcher decides a priori:

* the LoRA's tensors are finite: the reader refuses NaN/Inf when the file is read;
* each adapter kind bounds its scaled delta from its small factors (``WeightDelta.abs_bound``, computed once per
  delta), e.g. a low-rank pair by Cauchy–Schwarz: ``|ΔW_ij| = |scale · Σ_k up_ik down_kj| ≤ |scale| · ‖up_i‖ ·
  ‖down_j‖``, so ``max|ΔW| ≤ |scale| · max_i ‖up_i‖ · max_j ‖down_j‖``;
* a low-rank pair also has a rough bound, ``|scale| · r · max|up| · max|down|`` (one ``aminmax`` per factor,
  no float32 copy), tried first: it is enough wherever the fused value stays far from the dtype's limit;
* rounding: each kind's bound already covers its own float32 arithmetic. A float32 sum or dot product of n terms
  differs from the exact one by at most ``γ_n · Σ|terms|`` (``γ_n = n·u / (1 − n·u)``, ``u = 2⁻²⁴``, whatever
  the summation order, FMA or not), so the computed value is at most ``(1 + γ_n)`` times the bound.

First from the deltas alone (``proven_finite_for_any_weight``): if ``Σ|s|·bound · (1 + γ)`` is within a quarter
of the dtype's spacing at its largest finite value, no finite weight can be carried to Inf, and ``max|W|`` (a
pass over the whole weight) is never computed. Else with it: if ``(max|W| + Σ|s|·bound) · (1 + γ)`` is at most
the dtype's largest finite value, every float32 value computed stays in range (so no Inf appears, and NaN needs
an Inf or NaN operand), and rounding it to the dtype cannot exceed that largest value either (rounding is
monotone and the largest value is representable). Such a parameter needs no scan. Where the bound proves nothing, one element may still prove an
overflow (``certain_overflow``), refused before anything is written; otherwise the written chunks are scanned.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

UNIT_ROUNDOFF = 2.0 ** -24  # float32
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_FLOAT64_SLACK = 1.0 + 1e-9  # the bounds themselves are computed in float64: far below this relative error


def rounding_growth(operations: int) -> float:
    """``1 + γ_n``: how much ``n`` float32 roundings can grow a value, relative to the sum of its absolute terms."""
    nu = operations * UNIT_ROUNDOFF
    return math.inf if nu >= 0.5 else 1.0 + nu / (1.0 - nu)


def largest_abs(tensor: torch.Tensor) -> float:
    """``max |tensor|`` (NaN when it holds a NaN, Inf when an Inf): one pass, no temporary copy. NaN too for a
    dtype torch cannot reduce (fp8 storage, which the patcher rounds with saturation and never checks)."""
    if tensor.numel() == 0:
        return 0.0
    if tensor.element_size() == 1:
        return math.nan
    low, high = (float(v) for v in torch.aminmax(tensor.detach().reshape(-1)))
    return math.nan if math.isnan(low) or math.isnan(high) else max(-low, high)


def largest_norm(matrix: torch.Tensor, dim: int) -> tuple:
    """``(norm, index)`` of the longest row (``dim=1``) or column (``dim=0``) of ``matrix`` flattened to 2-D: an
    upper bound of that norm (``index`` only says where it likely is). Summed in float32 with a rounding margin
    where that cannot overflow (``_largest_norm_float32``), else in float64 (a float32 or narrower value squared
    cannot overflow it). Squares summed along ``dim`` rather than ``vector_norm``: its strided reduction over
    columns cost several times more, once per delta of every file read."""
    if matrix.numel() == 0:
        return 0.0, 0
    flat = matrix.detach().reshape(matrix.shape[0], -1)
    if flat.dtype in (torch.bfloat16, torch.float16, torch.float32):
        found = _largest_norm_float32(flat, dim)
        if found is not None:
            return found
    square, index = flat.to(torch.float64).square().sum(dim=dim).max(dim=0)
    return math.sqrt(float(square)) * _FLOAT64_SLACK, int(index)


def _largest_norm_float32(flat: torch.Tensor, dim: int) -> Optional[tuple]:
    """``largest_norm`` summed in float32, None when a sum overflowed (or is NaN). Why: the float64 copy and
    squares of every factor cost a fifth of a bfloat16 fuse; float32 halves that and the margin keeps it a bound.

    Why it is an upper bound: each computed sum of n squares is at least ``(1 − γ_{n+1})`` times the exact sum
    (the squares' own rounding and the sum's, in any order), less what underflow loses: at most 2⁻¹⁴⁹ per term.
    So the exact sum is at most ``(computed + n·2⁻¹⁴⁹) / (1 − γ_{n+1})``."""
    terms = int(flat.shape[dim])
    growth = rounding_growth(terms + 1) - 1.0
    if growth >= 0.5:
        return None
    square, index = flat.to(torch.float32, copy=True).square_().sum(dim=dim).max(dim=0)
    square = float(square)
    if not math.isfinite(square):
        return None
    exact_at_most = (square + terms * 2.0 ** -149) / (1.0 - growth)
    return math.sqrt(exact_at_most) * _FLOAT64_SLACK, int(index)


def product_bound(first: float, second: float, terms: int, scale: float = 1.0) -> Optional[float]:
    """Bound of a float32 dot product of ``terms`` terms whose exact size is at most ``first · second`` (norms),
    then multiplied by ``scale`` (one more rounding, the scale itself rounded to float32: one more). None when the
    unscaled product might not fit float32 (it is computed before the scale is applied)."""
    unscaled = first * second * rounding_growth(terms)
    if not unscaled <= FLOAT32_MAX:
        return None
    return abs(scale) * unscaled * rounding_growth(2)


def finite_limit(dtype: torch.dtype) -> float:
    """The largest value a fused weight of ``dtype`` may reach: the dtype's and the float32 work buffer's."""
    return min(float(torch.finfo(dtype).max), FLOAT32_MAX)


def overflow_threshold(dtype: torch.dtype) -> float:
    """A size at or above which a float32 result, or its rounding to ``dtype``, is certainly infinite: the power
    of two just above the largest finite value (the rounding threshold lies between the two)."""
    return float(2.0 ** math.ceil(math.log2(finite_limit(dtype))))


def _ask(delta, method: str, *args):
    """A kind's answer to one of the bound questions; None from a kind registered without them (it is scanned)."""
    ask = getattr(delta, method, None)
    return ask(*args) if callable(ask) else None


def _contributions_bound(terms: Sequence[tuple], rough: bool = False) -> Optional[float]:
    """``Σ |strength| · bound`` over ``(strength, delta)`` pairs; None when a kind has no bound. ``rough``: each
    kind's cheaper, looser ``rough_abs_bound`` where it has one."""
    total = 0.0
    for strength, delta in terms:
        bound = _ask(delta, "rough_abs_bound") if rough else None
        if bound is None:
            bound = _ask(delta, "abs_bound")
        if bound is None:
            return None
        total += abs(strength) * bound
    return total


def proven_finite_for_any_weight(dtype: torch.dtype, terms: Sequence[tuple]) -> bool:
    """True when no FINITE element of any weight of ``dtype`` can leave the dtype's range, whatever ``max|W|``:
    then that maximum (a pass over the whole weight, about a tenth of a bfloat16 fuse) is never computed.

    Why that is exact: let M be the dtype's largest finite value and h half its spacing there (bfloat16 2¹¹⁹,
    float16 16, float32 2¹⁰³). If all contributions together, grown by the running sum's roundings, are at most
    h/2, every float32 intermediate ``W + partial sum`` of a finite W is within M + h/2 plus one float32 rounding
    (far below h/2 for the narrower dtypes, none past M for float32 itself): inside float32's range, and rounding
    it to the dtype gives at most M (only values from M + h on round to Inf). A non-finite W element stays
    non-finite, as the scan allows. Only for the 16- and 32-bit floats (float64 weights may exceed the float32
    work buffer; fp8 storage saturates and is never checked)."""
    info = torch.finfo(dtype)
    if info.bits not in (16, 32) or float(info.max) > FLOAT32_MAX:
        return False
    half_spacing = (overflow_threshold(dtype) - finite_limit(dtype)) / 2.0
    allowed = half_spacing / 2.0 / rounding_growth(len(terms) + 1)
    rough = _contributions_bound(terms, rough=True)  # proves every ordinary fuse
    if rough is not None and rough <= allowed:
        return True
    if not any(callable(getattr(delta, "rough_abs_bound", None)) for _, delta in terms):
        return False  # the rough sum was already the tight one
    tight = _contributions_bound(terms)
    return tight is not None and tight <= allowed


def proven_finite(dtype: torch.dtype, base_abs_max: float, terms: Sequence[tuple]) -> bool:
    """True when no element of ``W + Σ strength·delta`` can leave ``dtype``'s finite range; ``terms`` are
    ``(strength, delta)`` pairs, ``base_abs_max`` is ``max|W|`` of the original."""
    total = _contributions_bound(terms)
    if not math.isfinite(base_abs_max) or total is None:
        return False
    # the running float32 sum over the base and every contribution: one rounding each
    return (base_abs_max + total) * rounding_growth(len(terms) + 1) <= finite_limit(dtype)


def certain_overflow(dtype: torch.dtype, source: torch.Tensor, terms: Sequence[tuple]) -> Optional[tuple]:
    """An element ``(row, column)`` of the fused value (``source`` flattened to 2-D) that overflows ``dtype``
    whatever the float32 rounding, found at the element where the largest contribution peaks; None when no kind
    can say (``peak_index``/``value_at``) or that element does not prove it."""
    probes = []
    for strength, delta in terms:
        index, bound = _ask(delta, "peak_index"), _ask(delta, "abs_bound")
        if index is not None:
            probes.append((abs(strength) * (math.inf if bound is None else bound), index))
    if not probes:
        return None
    row, column = max(probes)[1]
    base = float(source[row, column])
    if not math.isfinite(base):
        return None
    value, error, size = base, 0.0, abs(base)
    for strength, delta in terms:
        at = _ask(delta, "value_at", row, column)
        if at is None:
            return None
        exact, own_error = at
        value += strength * exact
        error += abs(strength) * own_error
        size += abs(strength) * (abs(exact) + own_error)
    error += (rounding_growth(len(terms) + 1) - 1.0) * size
    return (row, column) if abs(value) - error >= overflow_threshold(dtype) else None
