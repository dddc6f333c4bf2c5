"""Our own validation of a ``.safetensors`` header, done before any tensor is touched.

Why our own: the safetensors library reports a truncated or inconsistent file with terse messages that name
neither the file nor the tensor, and it happily returns integer/bool tensors that would corrupt a weight when
added to it. Users see these files come out of half-finished downloads and ad-hoc converters, so we check the
layout ourselves and raise a ``LoraFileError`` that names the file and the key.

Format (https://github.com/huggingface/safetensors): 8 bytes little-endian u64 ``N``, then ``N`` bytes of JSON
``{key: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, then the data buffer.
Offsets are relative to the start of the buffer; tensors must tile the buffer exactly, without gaps or overlap.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass

from ..errors import LoraFileError
from ..io import json_limits
from ..io.regular_files import open_regular

# bytes per element of every dtype the format defines
_ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})
# A header larger than this is not a LoRA header (real ones are well under 2 MiB): at most one byte more is read.
_MAX_HEADER_BYTES = 32 * 1024 * 1024
# ``check_header_budget``: a real file has a few thousand tensors; the format nests three levels deep
# (header object -> entry object -> shape / data_offsets list)
MAX_HEADER_TENSORS = 100_000
MAX_HEADER_DEPTH = 3
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # unrolled: twice as fast as (?:[^"\\]|\\.)*
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


@dataclass(frozen=True)
class TensorEntry:
    dtype: str  # safetensors dtype code, e.g. "BF16"
    shape: tuple


@dataclass(frozen=True)
class SafetensorsHeader:
    metadata: dict  # the ``__metadata__`` strings (empty when absent)
    tensors: dict  # key -> TensorEntry, in file order


def read_header(path: str, display_name: str, *, allow_integer_scalars: bool = True) -> SafetensorsHeader:
    """Validate the header of ``path`` against the file size and return its metadata and tensor table.

    ``allow_integer_scalars``: a one-element integer tensor named ``*.alpha`` is accepted (alpha is a number,
    some exporters store it as an int); every other non-float tensor is refused.
    """
    try:
        with open_regular(path) as handle:
            file_size = os.fstat(handle.fileno()).st_size
            header_len = _header_length(handle, file_size, display_name)
            raw_header = handle.read(min(header_len, _MAX_HEADER_BYTES + 1))
    except OSError as exc:
        raise LoraFileError(f"{display_name}: cannot read the file ({exc.strerror or exc})") from exc
    check_header_budget(raw_header, display_name)
    try:
        header = json_limits.loads(raw_header.decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as exc:
        raise LoraFileError(f"{display_name}: safetensors header lists {exc.args[0]!r} twice; which entry is meant "
                            "is ambiguous (readers disagree), so the file is refused") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoraFileError(f"{display_name}: safetensors header is not valid JSON ({exc}); "
                            f"the file is damaged or not a safetensors file") from exc
    if not isinstance(header, dict):
        raise LoraFileError(f"{display_name}: safetensors header is not a JSON object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise LoraFileError(f"{display_name}: safetensors __metadata__ must map strings to strings")

    data_size = file_size - 8 - header_len
    tensors = {}
    spans = []
    for key, entry in header.items():
        tensors[key] = _validate_entry(key, entry, display_name, allow_integer_scalars)
        begin, end = entry["data_offsets"]
        if end > data_size:
            raise LoraFileError(
                f"{display_name}: tensor {key!r} ends at byte {end} of the data buffer, which has only {data_size} "
                f"bytes; the file is truncated")
        spans.append((begin, end, key))
    _check_tiling(spans, data_size, display_name)
    return SafetensorsHeader(metadata=dict(metadata), tensors=tensors)


def check_safetensors_prefix(path: str, display_name: str) -> None:
    """LoraFileError when ``path`` cannot be a safetensors file by its first 8 bytes alone (a 0-byte file, a
    header longer than the file): what a prompt's validation can refuse without reading the header."""
    try:
        with open_regular(path) as handle:
            _header_length(handle, os.fstat(handle.fileno()).st_size, display_name)
    except OSError as exc:
        raise LoraFileError(f"{display_name}: cannot read the file ({exc.strerror or exc})") from exc


def _header_length(handle, file_size: int, display_name: str) -> int:
    prefix = handle.read(8)
    if len(prefix) < 8:
        raise LoraFileError(f"{display_name}: not a safetensors file (only {file_size} bytes; truncated?)")
    (header_len,) = struct.unpack("<Q", prefix)
    if 8 + header_len > file_size:
        raise LoraFileError(f"{display_name}: safetensors header claims {header_len} bytes but the file has "
                            f"{file_size} bytes; the file is truncated or not a safetensors file")
    return header_len


def check_header_budget(raw_header: bytes, display_name: str, *, error=LoraFileError,
                        max_bytes: int = _MAX_HEADER_BYTES) -> None:
    """Refuse a header that is too large, lists too many tensors or nests deeper than the format does, before
    any JSON parser sees it: parsing a crafted header costs seconds and gigabytes (800K empty tensors), or
    a ``RecursionError`` (100K nested lists). Counting and the depth check run at C speed on the raw bytes."""
    if len(raw_header) > max_bytes:  # callers read at most max_bytes + 1
        raise error(f"{display_name}: safetensors header is over the {max_bytes}-byte budget; real files have "
                    "headers of a few megabytes at most")
    tensors = raw_header.count(b'"data_offsets"')
    if tensors > MAX_HEADER_TENSORS:
        raise error(f"{display_name}: safetensors header lists {tensors} tensors, over the budget of "
                    f"{MAX_HEADER_TENSORS}; refused before parsing")
    brackets = _JSON_STRING.sub(b"", raw_header).translate(None, _NOT_BRACKETS)
    for _ in range(MAX_HEADER_DEPTH):  # each pass removes the innermost level of every nesting
        brackets = _INNERMOST.sub(b"", brackets)
    if brackets:
        raise error(f"{display_name}: safetensors header nests deeper than the format's {MAX_HEADER_DEPTH} "
                    "levels (or its brackets do not match); the file is damaged or crafted")


class _DuplicateKey(Exception):
    pass


def _refuse_duplicate_keys(pairs: list) -> dict:
    """``object_pairs_hook``: plain ``json.loads`` keeps the last of two equal keys without a word."""
    result = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _validate_entry(key, entry, display_name, allow_integer_scalars) -> TensorEntry:
    if not isinstance(entry, dict):
        raise LoraFileError(f"{display_name}: header entry {key!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _ITEMSIZE:
        raise LoraFileError(f"{display_name}: tensor {key!r} has unknown dtype {dtype!r}")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)):
        raise LoraFileError(f"{display_name}: tensor {key!r} has an invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise LoraFileError(f"{display_name}: tensor {key!r} has invalid data_offsets {offsets!r}")
    expected_bytes = math.prod(shape) * _ITEMSIZE[dtype]
    if offsets[1] - offsets[0] != expected_bytes:
        raise LoraFileError(
            f"{display_name}: tensor {key!r} is declared {dtype} {shape} ({expected_bytes} bytes) but its "
            f"data_offsets span {offsets[1] - offsets[0]} bytes; the header is inconsistent")
    if dtype not in FLOAT_DTYPES:
        integer_alpha = allow_integer_scalars and key.endswith(".alpha") and math.prod(shape) == 1 and dtype != "BOOL"
        if not integer_alpha:
            raise LoraFileError(
                f"{display_name}: tensor {key!r} has dtype {dtype}; a LoRA holds floating-point tensors only")
    return TensorEntry(dtype=dtype, shape=tuple(shape))


def _check_tiling(spans, data_size, display_name) -> None:
    """Tensors must cover the data buffer exactly: no overlap, no hole, nothing after the last tensor."""
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            what = "overlaps the previous tensor" if begin < position else f"leaves a gap at byte {position}"
            raise LoraFileError(f"{display_name}: tensor {key!r} starts at byte {begin} and {what}; "
                                f"the header's data_offsets are inconsistent")
        position = end
    if position != data_size:
        raise LoraFileError(f"{display_name}: the data buffer has {data_size} bytes but the tensors cover "
                            f"{position}; the file has trailing bytes or is damaged")
