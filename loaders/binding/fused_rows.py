"""Computing one fused parameter: ``original + Σ strength · delta`` summed in float32 and rounded once, in
float32 row chunks or, for one bfloat16 LoRA pair on a bfloat16 weight where oneDNN runs bfloat16 gemms, by one
gemm in place (``_one_gemm_factors`` says why that is the same value).

Split from ``patching`` (which decides WHAT to write and keeps the originals): this is HOW one value is written,
shared by the patcher and ``lorabind merge``. Whether the result can leave the dtype's range is decided a priori
(``finite_bounds``): a proven parameter is written without a second look; one the bound does not prove is
refused up front when one element proves the overflow, else its written chunks are scanned.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import torch

from .. import fp8
from ..errors import KeyMatchError
from ..lora.finite_bounds import certain_overflow, largest_abs, proven_finite, proven_finite_for_any_weight

# Rows per float32 work chunk are chosen so one chunk stays around this size: the fused value is computed and
# written chunk by chunk, so the extra memory of a fuse is the backups plus this buffer (not a float32 copy of the
# largest layer) and the work stays in cache instead of page-faulting a fresh full-size temporary per layer.
CHUNK_BYTES = 8 * 1024 * 1024


class Workspace:
    """float32 work buffers reused across parameters, one per device, grown to the largest chunk needed (at most
    about ``CHUNK_BYTES``). Why: a fuse allocates backups between these temporaries, and a fresh buffer per
    parameter would leave freed holes between the backups that the allocator keeps resident."""

    def __init__(self):
        self._buffers: dict[torch.device, torch.Tensor] = {}

    def take(self, numel: int, device: torch.device) -> torch.Tensor:
        buffer = self._buffers.get(device)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[device] = torch.empty(numel, dtype=torch.float32, device=device)
        return buffer[:numel]


class _BaseRows:
    """``base_rows(start, stop)``: rows of the unpatched value in float32 on the work device (fp8: times its
    scale), for a kind whose delta depends on the base weight (DoRA); ``rows``/``cols``: the flattened shape."""

    def __init__(self, source: torch.Tensor, device: torch.device, scale: Optional[torch.Tensor]):
        self.source, self.device, self.scale = source, device, scale
        self.rows, self.cols = int(source.shape[0]), int(source.shape[1])

    def __call__(self, start: int, stop: int) -> torch.Tensor:
        rows = self.source[start:stop].to(device=self.device, dtype=torch.float32)
        return rows * self.scale if self.scale is not None else rows


class NonFiniteResultError(KeyMatchError):
    """A fused value overflows the parameter's dtype (finite factors, e.g. 1e38 scaled past bf16's range)."""


def chunk_is_finite(written: torch.Tensor, source_was_finite: bool) -> bool:
    """The scan of one written chunk, for parameters the bound does not prove: False when it holds a non-finite
    value that its original rows did not already hold (a module-level function: tests count the scans)."""
    return bool(torch.isfinite(written).all()) or not source_was_finite


def _overflow_error(dtype: torch.dtype, where: str = "") -> NonFiniteResultError:
    return NonFiniteResultError(
        f"the fused value is not finite in {str(dtype).replace('torch.', '')}{where}: strength x scale x "
        f"up @ down (or a diff) exceeds the dtype's range")


def _needs_scan(dest: torch.Tensor, source: torch.Tensor, terms: list, original_abs_max: Optional[float]) -> bool:
    """False when ``finite_bounds`` proves every element finite (from the deltas alone where it can, else with
    ``max|original|``); raises, before anything is written, when one element proves an overflow; True (scan the
    written chunks) otherwise."""
    if proven_finite_for_any_weight(dest.dtype, terms):
        return False
    base_abs_max = largest_abs(source) if original_abs_max is None else original_abs_max
    if proven_finite(dest.dtype, base_abs_max, terms):
        return False
    if math.isfinite(base_abs_max):
        element = certain_overflow(dest.dtype, source, terms)
        if element is not None:
            raise _overflow_error(dest.dtype, f" at element {list(element)}")
    return True


@functools.lru_cache(maxsize=None)
def has_onednn_bf16_gemm() -> bool:
    """Whether this CPU runs bfloat16 gemms through oneDNN (AVX-512 BF16, AMX): without it torch's bfloat16 gemm
    is a plain loop, exact but about 100 times slower than the float32 row path."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _one_gemm_factors(dest: torch.Tensor, original: torch.Tensor, terms: list) -> Optional[tuple]:
    """``(strength · scale, up, down)`` when ``dest``'s value can be written by one gemm in its own dtype, else None.

    Why that is exact: for a bfloat16 weight and one low-rank pair stored in bfloat16, each product of two
    bfloat16 values is exact in float32 (8 + 8 significant bits), oneDNN sums the rank-r dot in float32, scales
    it by ``alpha`` and adds the bfloat16 weight (its ``beta = 1`` sum) in float32, then rounds once to bfloat16:
    the row path's formula without its float32 copy of the weight, only the float32 summation order differs (as
    between any two sgemm kernels). Measured against a float64 reference on four of the bench's 1536 x 1536 layers:
    46 of 9.4M elements one ulp off, the row path 45 (``tests/loaders/patching/test_fused_rows_gemm.py``). Only
    on the CPU (a CUDA bfloat16 gemm may reduce in bfloat16) and with one term (two would round twice)."""
    if (len(terms) != 1 or dest.dtype != torch.bfloat16 or dest.dim() != 2 or dest.device.type != "cpu"
            or original.dtype != dest.dtype or original.device != dest.device
            or not torch.backends.mkldnn.enabled or not has_onednn_bf16_gemm()):
        return None
    strength, delta = terms[0]
    factors = getattr(delta, "gemm_factors", lambda dtype: None)(dest.dtype)
    if factors is None:
        return None
    up, down = factors
    if up.device != dest.device or (int(up.shape[0]), int(down.shape[1])) != tuple(dest.shape):
        return None
    return float(strength) * float(delta.scale), up, down


def _written_by_one_gemm(dest: torch.Tensor, original: torch.Tensor, terms: list, dest_holds_original: bool) -> bool:
    """Writes ``dest`` by one gemm in its dtype and returns True where ``_one_gemm_factors`` allows, else False."""
    factors = _one_gemm_factors(dest, original, terms)
    if factors is None:
        return False
    alpha, up, down = factors
    if not dest_holds_original and original is not dest:
        dest.copy_(original)
    dest.addmm_(up, down, alpha=alpha)  # the one rounding to dest's dtype
    return True


def _is_own_buffer(dest: torch.Tensor, original: torch.Tensor) -> bool:
    """Whether ``dest`` can be its own float32 work buffer: the same rows and operations, and the rounding a
    buffer's copy-out would do is none, so it saves a copy of every element (a host's float32 weights, ComfyUI's on
    CPU: bench_comfyui). Not where ``original`` is ``dest`` (a DoRA delta reads base rows while they are added to);
    the caller also keeps the buffer for a scan (rows checked before written) and for fp8 storage."""
    return dest.dtype == torch.float32 and dest.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()


def write_patched(dest: torch.Tensor, original: torch.Tensor, contributions: Sequence, workspace: Optional[Workspace]
                  = None, *, storage=None, seed_key: str = "", original_abs_max: Optional[float] = None,
                  dest_holds_original: bool = False) -> None:
    """``dest = original + Σ strength · delta`` over every contribution's kind deltas, computed in float32 and
    rounded to ``dest``'s dtype exactly once per element.

    ``dest`` is the live parameter (fuse) or a fresh tensor of the output dtype (merge); ``original`` may live on
    another device (CPU backups) or be ``dest`` itself (a file-backed original on first touch): every chunk's
    rows are read before they are written, and a kind reading the whole base (DoRA's column norms) does so
    before the first write. Rows are processed in chunks of about ``CHUNK_BYTES``; the chunking is fixed by
    the shape, so recomputing a value (roll-back) gives the same bits. A patcher passes its ``Workspace``;
    ``original_abs_max`` (``max|original|``) is computed here when None and the deltas alone prove nothing.
    ``storage``: an fp8 weight's ``fp8.StoredWeight`` — the value is fp8 x scale, the sum is divided by the scale
    again and rounded the way it asks (``fp8.round_to_fp8``, seeded by ``seed_key``), saturating: never Inf.
    ``dest_holds_original``: ``dest`` still holds the unpatched value (first touch), so the one-gemm path
    (``_one_gemm_factors``) adds to it in place without copying ``original`` over it first.
    """
    device = dest.device
    if not dest.is_contiguous():  # rows of a non-contiguous tensor are not views of one flat buffer
        staged = torch.empty(dest.shape, dtype=dest.dtype, device=device)
        write_patched(staged, original, contributions, workspace, storage=storage, seed_key=seed_key,
                      original_abs_max=original_abs_max)
        dest.copy_(staged)
        return
    rows = dest.shape[0] if dest.dim() >= 1 else 1
    source = original.reshape(rows, -1)
    target = dest.view(rows, -1)
    terms = [(c.strength, delta) for c in contributions for delta in c.deltas]
    scan = storage is None and _needs_scan(dest, source, terms, original_abs_max)
    if storage is None and not scan and _written_by_one_gemm(dest, original, terms, dest_holds_original):
        return
    scale = storage.scale.to(device) if storage is not None and storage.scale is not None else None
    # each adapter kind computes its delta's rows in float32 (``lora.kinds.base.WeightDelta.row_adder``)
    base_rows = _BaseRows(source, device, scale)
    adders = [(delta.row_adder(device, base_rows), strength) for strength, delta in terms]
    cols = source.shape[1]
    step = max(1, CHUNK_BYTES // (4 * max(1, cols)))
    in_place = storage is None and not scan and _is_own_buffer(dest, original)
    buffer = None if in_place else (workspace or Workspace()).take(min(step, rows) * cols, device).view(-1, cols)
    generator = fp8.seeded_generator(seed_key) if storage is not None else None
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        chunk = target[start:stop] if in_place else buffer[: stop - start]
        chunk.copy_(source[start:stop])
        if scale is not None:
            chunk.mul_(scale)
        for add_rows, strength in adders:
            add_rows(chunk, start, stop, strength)
        if in_place:
            continue
        if storage is not None:  # the one rounding, into the fp8 storage
            if scale is not None:
                chunk.div_(scale)
            target[start:stop].copy_(fp8.round_to_fp8(chunk, storage.rounding, seed_key, generator))
            continue
        # looked at before the rows are written: ``original`` may be ``dest`` itself
        source_was_finite = scan and bool(torch.isfinite(source[start:stop]).all())
        target[start:stop].copy_(chunk)  # the one rounding to dest's dtype
        if scan and not chunk_is_finite(target[start:stop], source_was_finite):
            raise _overflow_error(dest.dtype)
