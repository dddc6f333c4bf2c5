"""Reading single tensors of a safetensors model file by plain reads into one reused buffer.

Why not ``safe_open(...).get_tensor`` for the re-reads of file-backed originals (``weight_sources``): a strength
change or switch re-reads every touched weight, and at Wan2.1-1.3B with a published-layout LoRA (822 tensors,
2.8 GB) opening the file per tensor parsed its whole header 822 times (0.5 s) and copying out of the fresh
mapping faulted in every page again (0.6 s, 1 thread; profiled in issue 47). Here the header's table is parsed
once per file version, and each tensor is read with ``preadv`` into a buffer the caller reuses: the kernel copies
from the page cache at memory speed and no page of a new mapping or allocation is faulted in per tensor.

Only what this module can prove it reads is read here (a float or integer dtype it knows, a span inside the
file that matches the shape); anything else answers None and the caller falls back to ``safe_open``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import threading
from collections import OrderedDict
from typing import Optional

import torch

from . import json_limits
from .file_identity import stat_identity
from .regular_files import open_regular

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
# a model's header is a few MB at most; a larger one is not parsed here (the caller reads through safe_open)
_MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_CACHED_TABLES = 64  # files whose tables are kept (a sharded 14B model has a dozen)
_CHANGED = object()  # ``_read_table``: the file is not the version asked about
ALIGNMENT = 64  # bytes: what the CPU kernels' rounding depends on (``aligned_bytes``)


def stored_bytes(stored) -> int:
    """Bytes of a tensor as a safetensors file stores it, from its slice's header fields (``get_dtype``,
    ``get_shape``), without reading it; 0 for a dtype this module does not know."""
    dtype = _DTYPES.get(stored.get_dtype())
    if dtype is None:
        return 0
    return math.prod(int(d) for d in stored.get_shape()) * torch.empty((), dtype=dtype).element_size()


class _Tables:
    """Process-wide: (path, file identity) -> {key: (dtype, shape, absolute offset, nbytes)}. A rewritten file has
    a new identity, so its old table is never used again."""

    def __init__(self):
        self._tables: "OrderedDict[tuple, Optional[dict]]" = OrderedDict()
        self._lock = threading.Lock()

    def entry(self, path: str, identity, key: str) -> Optional[tuple]:
        table = self.table(path, identity)
        return None if table is None else table.get(key)

    def table(self, path: str, identity) -> Optional[dict]:
        """The file's whole table, parsed once per file version; None when this module does not read it."""
        cache_key = (path, identity)
        with self._lock:
            table = self._tables.get(cache_key, False)
            if table is not False:
                self._tables.move_to_end(cache_key)
        if table is False:
            table = _read_table(path, identity)
            if table is _CHANGED:  # not the version asked about: nothing read, nothing remembered
                return None
            with self._lock:
                self._tables[cache_key] = table
                while len(self._tables) > MAX_CACHED_TABLES:
                    self._tables.popitem(last=False)
        return table

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()


tables = _Tables()


def _read_table(path: str, identity):
    """The file's tensor table with absolute offsets; None when the header is not one this module reads;
    ``_CHANGED`` when the file opened is no longer the version ``identity`` names (replaced or rewritten since the
    caller checked it: its table must not be remembered under the old version)."""
    try:
        with open_regular(path) as handle:
            found = os.fstat(handle.fileno())
            if stat_identity(found) != tuple(_fields(identity)):
                return _CHANGED
            size = found.st_size
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len > min(_MAX_HEADER_BYTES, size - 8):
                return None
            header = json_limits.loads(handle.read(header_len).decode("utf-8"))
    except (OSError, ValueError, struct.error):
        return None
    if not isinstance(header, dict):
        return None
    start = 8 + header_len
    table = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        found = _entry(entry, start, size)
        if found is not None:
            table[key] = found
    return table


def _fields(identity) -> tuple:
    """A file identity as ``stat_identity``'s tuple, whether given as that tuple or as a dataclass of the same
    fields in the same order (``weight_sources.FileIdentity``)."""
    return identity if isinstance(identity, tuple) else dataclasses.astuple(identity)


def _entry(entry, start: int, size: int) -> Optional[tuple]:
    try:
        dtype = _DTYPES.get(entry["dtype"])
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        return None
    if dtype is None or not 0 <= begin <= end or start + end > size:
        return None
    if math.prod(shape) * torch.empty((), dtype=dtype).element_size() != end - begin:
        return None
    return dtype, shape, start + begin, end - begin


class ReadBuffer:
    """One host buffer that tensors are read into, grown to the largest read and reused: the tensor ``read``
    returns is a view of it, valid until the next ``read``. Held for one bind (``WeightPatcher.apply``), so its
    memory is one layer, for the bind's duration only."""

    def __init__(self):
        self._bytes: Optional[torch.Tensor] = None
        self._part: Optional[torch.Tensor] = None  # a part of another dimension than the rows, made contiguous

    def read(self, path: str, identity, key: str, part: Optional[tuple] = None) -> Optional[torch.Tensor]:
        """Tensor ``key`` of ``path`` (whose identity the caller has just checked), or only its ``part`` (dim,
        start, stop: a tensor-parallel shard's rows or columns), or None when this module does not read it (the
        caller then uses ``safe_open``). Rows are read alone; another dimension's part is cut from the whole
        tensor read into the buffer, into a second buffer of the part's size."""
        found = tables.entry(path, identity, key)
        if found is None:
            return None
        dtype, shape, offset, nbytes = found
        if part is None:
            return self._read(path, offset, nbytes, dtype, shape)
        dim, start, stop = part
        if not (0 <= dim < len(shape) and 0 <= start < stop <= shape[dim]):
            return None
        if dim == 0:
            row = nbytes // shape[0]
            return self._read(path, offset + start * row, (stop - start) * row, dtype, (stop - start, *shape[1:]))
        whole = self._read(path, offset, nbytes, dtype, shape)
        if whole is None:
            return None
        cut = whole.narrow(dim, start, stop - start)
        size = cut.numel() * cut.element_size()
        if self._part is None or self._part.numel() < size:
            self._part = torch.empty(size, dtype=torch.uint8)
        return self._part[:size].view(dtype).view(cut.shape).copy_(cut)

    def _read(self, path: str, offset: int, nbytes: int, dtype, shape) -> Optional[torch.Tensor]:
        if self._bytes is None or self._bytes.numel() < nbytes:
            self._bytes = torch.empty(nbytes, dtype=torch.uint8)
        raw = self._bytes[:nbytes]
        if nbytes and not _read_exactly(path, offset, raw):
            return None
        return raw.view(dtype).view(shape)


def read_owned(path: str, identity, key: str) -> Optional[torch.Tensor]:
    """Tensor ``key`` of ``path`` (whose identity the caller has just checked) in memory of its own, never a mapping
    of the file (a file truncated later cannot fault it, one rewritten cannot change it), at the address modulo
    ``ALIGNMENT`` that a mapping of the file would give it; None when this module does not read it."""
    found = tables.entry(path, identity, key)
    if found is None:
        return None
    dtype, shape, offset, nbytes = found
    raw = aligned_bytes(nbytes, offset % ALIGNMENT)
    if nbytes and not _read_exactly(path, offset, raw):
        return None
    try:
        return raw.view(dtype).view(shape)
    except RuntimeError:  # an offset that is no multiple of the element size: no mapping could view it either
        return None


def read_all_owned(path: str, identity, keys) -> Optional[dict]:
    """``{key: tensor}`` of ``keys``, read in one pass into one buffer of the process's own (``read_owned``'s
    alignment: each tensor where a mapping of the file would put it); None when this module does not read one of
    them. One read for a LoRA's 1,428 tensors, not one per tensor."""
    table = tables.table(path, identity)
    if table is None or any(key not in table for key in keys):
        return None
    found = [table[key] for key in keys]
    start = min((entry[2] for entry in found), default=0)
    end = max((entry[2] + entry[3] for entry in found), default=0)
    raw = aligned_bytes(end - start, start % ALIGNMENT)
    if end > start and not _read_exactly(path, start, raw):
        return None
    try:
        return {key: raw[offset - start:offset - start + nbytes].view(dtype).view(shape)
                for key, (dtype, shape, offset, nbytes) in zip(keys, found)}
    except RuntimeError:  # an offset that is no multiple of its element size
        return None


def aligned_bytes(nbytes: int, remainder: int) -> torch.Tensor:
    """``nbytes`` fresh bytes whose address is ``remainder`` modulo ``ALIGNMENT``. Why: the CPU kernels round
    differently for the same values at another alignment, so a weight re-read from its file must sit where the
    loader's mapping of the file put it for a model to compute what it computed before (``placement.staging``)."""
    flat = torch.empty(nbytes + ALIGNMENT, dtype=torch.uint8)
    shift = (remainder - flat.data_ptr()) % ALIGNMENT
    return flat[shift:shift + nbytes]


def _read_exactly(path: str, offset: int, out: torch.Tensor) -> bool:
    """Fill ``out`` (uint8, contiguous) with the file's bytes from ``offset``; False at a short read."""
    view = memoryview(out.numpy())
    done = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                return False
            done += got
    finally:
        os.close(fd)
    return True
