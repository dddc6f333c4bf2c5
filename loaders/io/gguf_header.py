"""Our own bounded reading of a GGUF file's header: metadata, tensor names, types, logical shapes and offsets.

Why our own scan and not ``gguf.GGUFReader``: the reader trusts the file. It loops over the declared key/value
and tensor counts, builds one numpy object per array element of the metadata (a declared 2**40-element array
is an unbounded loop) and maps tensors wherever their offsets point; a truncated file, a lying count or an
unknown type surfaces as a bare ``IndexError``/``ValueError`` naming neither the file nor the tensor, or never
returns. This scan reads the header sequentially through the file handle, checks every count and length
against what is left of the file and against budgets far above real files (``MAX_*``) BEFORE it reads what they
announce, and refuses by name. The tensors are then mapped from the offsets this scan checked (``gguf_tensors``); the
metadata is never handed to ``GGUFReader`` (it built 1.6 GB of objects in 45 s for 999,999 empty strings).
Detection and ``inspect`` need nothing more than this scan.

Format (GGUF v2/v3, little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic ``GGUF``,
u32 version, u64 tensor count, u64 key/value count; the key/values (string key, u32 value type, value); the
tensor infos (string name, u32 n_dims, n_dims x u64 dims, fastest-varying first, u32 ggml type, u64 offset
relative to the data section); padding to ``general.alignment`` (default 32); the data section.
Shapes here are logical and in torch order: the dims reversed (or ComfyUI-GGUF's ``comfy.gguf.orig_shape.<name>``
when a converter reshaped the tensor), never the quantized byte shape.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field

from ..errors import ModelLoadError
from .file_identity import stat_identity
from .regular_files import open_regular

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Budgets: far above the published denoisers (Wan 14B: ~1,100 tensors and a dozen keys; an LLM's tokenizer
# arrays hold ~150K strings) and far below what makes a crafted header cost minutes or gigabytes.
MAX_TENSORS = 100_000
MAX_KEYS = 65_536
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_ARRAY_ITEMS = 1_000_000  # all metadata arrays together: the metadata-bomb bound
# String items cost a Python object and a read each (numbers are one read per array): 999,999 empty strings fit
# in 8 MB and took the scan a second. A denoiser's metadata holds a few strings; an LLM's tokenizer ~150K each
# for tokens and merges, and lorabind reads no GGUF text encoder.
MAX_STRING_ITEMS = 262_144
MAX_STRING_BYTES = 1024 * 1024
MAX_NAME_BYTES = 4096
MAX_ALIGNMENT = 1 << 20
# ggml stops at 4 dims, but published Wan GGUFs carry the 5-D Conv3d ``patch_embedding.weight`` in F32
# (ComfyUI-GGUF's tools/fix_5d_tensors.py writes it back after llama.cpp's quantizer)
MAX_DIMS = 5
ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."

# GGUF metadata value types (the spec's numbering): struct format of each scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# The ggml types lorabind reads: unquantized, and the quantizations diffusers 0.42 dequantises
# (``diffusers.quantizers.gguf.utils.dequantize_functions``) that published Wan/Qwen-Image files use.
UNQUANTIZED_TYPES = ("F32", "F16", "BF16")
QUANTIZED_TYPES = ("Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "Q3_K", "Q2_K")
SUPPORTED_TYPES = UNQUANTIZED_TYPES + QUANTIZED_TYPES


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # ggml type name: "Q8_0", "F32", ...
    shape: tuple  # logical shape, torch order
    stored_shape: tuple  # the file's dims, torch order (differs from ``shape`` when a converter reshaped it)
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int

    @property
    def quantized(self) -> bool:
        return self.type_name not in UNQUANTIZED_TYPES


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict  # key -> int / float / bool / str / tuple (arrays)
    tensors: dict = field(default_factory=dict)  # name -> GGUFTensor, in file order
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0
    # ``stat_identity`` when the header was read: the tensors are mapped from these offsets only while it holds
    identity: tuple = ()

    @property
    def architecture(self):
        """``general.architecture`` ("wan", "qwen_image", ...) or None (stable-diffusion.cpp files have none)."""
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    def type_counts(self) -> dict:
        """{ggml type name: tensor count}, most frequent first."""
        counts: dict = {}
        for tensor in self.tensors.values():
            counts[tensor.type_name] = counts.get(tensor.type_name, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: -item[1]))


def header_summary(header: GGUFHeader) -> dict:
    """What ``lorabind inspect`` reports of a GGUF file, JSON-able: version, architecture, tensors by type and
    bytes, every tensor (name, type, logical shape) and the scalar metadata (arrays by their length)."""
    tensors = list(header.tensors.values())
    return {
        "gguf_version": header.version, "architecture": header.architecture, "alignment": header.alignment,
        "tensor_count": len(tensors), "types": header.type_counts(),
        "bytes": sum(t.n_bytes for t in tensors), "quantized_bytes": sum(t.n_bytes for t in tensors if t.quantized),
        "metadata": {k: (f"array of {len(v)}" if isinstance(v, tuple) else v) for k, v in header.metadata.items()},
        "tensors": [{"name": t.name, "type": t.type_name, "shape": list(t.shape)} for t in tensors],
    }


class _HeaderError(ValueError):
    """A header fault, worded for the user; ``read_gguf_header`` prefixes the file name."""


class _Cursor:
    """Sequential reads of the header through the file handle: every read is checked against the end of the
    file and the header budget before it happens, so a declared length never allocates more than the file has."""

    def __init__(self, handle, file_size: int):
        self.handle, self.file_size, self.position = handle, file_size, 0
        self.array_items = self.string_items = 0

    def take(self, count: int, what: str) -> bytes:
        if count > self.file_size - self.position:
            raise _HeaderError(f"{what} needs {count} bytes at byte {self.position} but the file ends at "
                               f"{self.file_size}; the file is truncated or its header is damaged")
        if self.position + count > MAX_HEADER_BYTES:
            raise _HeaderError(f"the header runs past the {MAX_HEADER_BYTES}-byte budget at {what}; real files' "
                               "headers are a few megabytes at most")
        data = self.handle.read(count)
        self.position += count
        return data

    def unpack(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))[0]

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        length = self.unpack("Q", what)
        if length > limit:
            raise _HeaderError(f"{what} declares a {length}-byte string, over the {limit}-byte budget")
        try:
            return self.take(length, what).decode("utf-8")
        except UnicodeDecodeError:
            raise _HeaderError(f"{what} is not UTF-8 text") from None

    def count_items(self, count: int, what: str) -> None:
        self.array_items += count
        if self.array_items > MAX_ARRAY_ITEMS:
            raise _HeaderError(f"{what} brings the metadata arrays to {self.array_items} items, over the budget of "
                               f"{MAX_ARRAY_ITEMS} (a metadata bomb, or not a model file)")

    def count_strings(self, count: int, what: str) -> None:
        self.string_items += count
        if self.string_items > MAX_STRING_ITEMS:
            raise _HeaderError(f"{what} brings the metadata's string array items to {self.string_items}, over the "
                               f"budget of {MAX_STRING_ITEMS} (a denoiser's metadata holds a few strings)")


def _value(cursor: _Cursor, value_type: int, what: str, nested: bool = False):
    if value_type in _SCALARS:
        return cursor.unpack(_SCALARS[value_type], what)
    if value_type == _STRING:
        return cursor.string(what)
    if value_type != _ARRAY or nested:
        raise _HeaderError(f"{what} has value type {value_type}, which GGUF does not define"
                           if value_type != _ARRAY else f"{what} nests arrays, which no model file does")
    item_type, count = cursor.unpack("I", what), cursor.unpack("Q", what)
    cursor.count_items(count, what)
    if item_type in _SCALARS:  # one bounded read for the whole array
        size = struct.calcsize("<" + _SCALARS[item_type])
        return struct.unpack(f"<{count}{_SCALARS[item_type]}", cursor.take(count * size, what))
    if item_type == _STRING:
        cursor.count_strings(count, what)
    return tuple(_value(cursor, item_type, f"{what}[{index}]", nested=True) for index in range(count))


def _read_metadata(cursor: _Cursor, count: int) -> dict:
    metadata: dict = {}
    for index in range(count):
        key = cursor.string(f"metadata key #{index}", MAX_NAME_BYTES)
        if key in metadata:
            raise _HeaderError(f"metadata key {key!r} appears twice; which value is meant is ambiguous")
        metadata[key] = _value(cursor, cursor.unpack("I", f"metadata {key!r}"), f"metadata {key!r}")
    return metadata


def _type_names() -> dict:
    import gguf  # lazy: the gguf package is needed only when a GGUF file is read

    return {int(t): t.name for t in gguf.GGMLQuantizationType}


def _read_tensor_infos(cursor: _Cursor, count: int) -> list:
    names, infos = _type_names(), []
    seen = set()
    for index in range(count):
        name = cursor.string(f"tensor #{index}'s name", MAX_NAME_BYTES)
        if name in seen:
            raise _HeaderError(f"tensor {name!r} is listed twice")
        seen.add(name)
        n_dims = cursor.unpack("I", f"tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _HeaderError(f"tensor {name!r} declares {n_dims} dimensions (1 to {MAX_DIMS} are read)")
        dims = struct.unpack(f"<{n_dims}Q", cursor.take(8 * n_dims, f"tensor {name!r}'s shape"))
        type_id, offset = cursor.unpack("I", f"tensor {name!r}"), cursor.unpack("Q", f"tensor {name!r}")
        type_name = names.get(type_id)
        if type_name not in SUPPORTED_TYPES:
            known = f"{type_name}, which" if type_name else f"type id {type_id}, which the gguf package does not " \
                                                               "know and"
            raise _HeaderError(f"tensor {name!r} is quantized as {known} lorabind does not read (it reads "
                               f"{', '.join(SUPPORTED_TYPES)})")
        infos.append((name, tuple(reversed(dims)), type_name, offset))
    return infos


def _tensor(name, stored_shape, type_name, offset, metadata, data_offset, data_size, alignment) -> GGUFTensor:
    """One tensor info checked: its shape fits its type's blocks, its data lies aligned inside the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    if min(stored_shape) < 1 or stored_shape[-1] % block_size:
        raise _HeaderError(f"tensor {name!r} has shape {list(stored_shape)}, which {type_name} cannot hold "
                           f"(rows must be a positive multiple of {block_size})")
    n_bytes = math.prod(stored_shape) // block_size * type_size
    if offset % alignment or offset > data_size or n_bytes > data_size - offset:
        raise _HeaderError(f"tensor {name!r} declares {n_bytes} bytes of {type_name} {list(stored_shape)} at data "
                           f"offset {offset}, but the file's data section holds {data_size} bytes (alignment "
                           f"{alignment}); the file is truncated or the shape is not real")
    shape = stored_shape
    orig = metadata.get(ORIG_SHAPE_KEY + name)
    if orig is not None:
        if not (isinstance(orig, tuple) and orig and all(type(d) is int and d > 0 for d in orig)
                and math.prod(orig) == math.prod(stored_shape)):
            raise _HeaderError(f"metadata {ORIG_SHAPE_KEY + name!r} = {orig!r} is not a shape of the "
                               f"{math.prod(stored_shape)} elements tensor {name!r} holds")
        shape = tuple(orig)
    return GGUFTensor(name=name, type_name=type_name, shape=shape, stored_shape=stored_shape,
                      offset=data_offset + offset, n_bytes=n_bytes)


def _check_no_overlap(tensors: list) -> None:
    end, previous = 0, None
    for tensor in sorted(tensors, key=lambda t: t.offset):
        if tensor.offset < end:
            raise _HeaderError(f"tensor {tensor.name!r} overlaps {previous!r} in the data section; the offsets "
                               "are inconsistent")
        end, previous = tensor.offset + tensor.n_bytes, tensor.name


def _alignment(metadata: dict) -> int:
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(value) is not int or value < 1 or value & (value - 1) or value > MAX_ALIGNMENT:
        raise _HeaderError(f"general.alignment {value!r} is not a power of two up to {MAX_ALIGNMENT}")
    return value


def _scan(handle, path: str, stat: os.stat_result) -> GGUFHeader:
    file_size = stat.st_size
    cursor = _Cursor(handle, file_size)
    if cursor.take(4, "the magic") != MAGIC:
        raise _HeaderError("not a GGUF file (no GGUF magic)")
    version = cursor.unpack("I", "the version")
    if version not in VERSIONS:
        raise _HeaderError(f"GGUF version {version} (lorabind reads versions {', '.join(map(str, VERSIONS))})")
    tensor_count, key_count = cursor.unpack("Q", "the tensor count"), cursor.unpack("Q", "the key count")
    if tensor_count > MAX_TENSORS or key_count > MAX_KEYS:
        raise _HeaderError(f"the header declares {tensor_count} tensors and {key_count} metadata keys, over the "
                           f"budgets of {MAX_TENSORS} and {MAX_KEYS}; refused before reading them")
    metadata = _read_metadata(cursor, key_count)
    infos = _read_tensor_infos(cursor, tensor_count)
    alignment = _alignment(metadata)
    data_offset = -(-cursor.position // alignment) * alignment
    data_size = max(file_size - data_offset, 0)
    tensors = [_tensor(*info, metadata, data_offset, data_size, alignment) for info in infos]
    _check_no_overlap(tensors)
    return GGUFHeader(path=path, version=version, metadata=metadata, tensors={t.name: t for t in tensors},
                      alignment=alignment, data_offset=data_offset, identity=stat_identity(stat))


def read_gguf_header(path, name: str = "") -> GGUFHeader:
    """The checked header of the GGUF file at ``path``; ``ModelLoadError`` naming the file (``name``, as the user
    gave it) and the key or tensor for anything truncated, inconsistent, unknown or over budget."""
    name = name or os.path.basename(str(path))
    try:
        with open_regular(path) as handle:
            return _scan(handle, str(path), os.fstat(handle.fileno()))
    except _HeaderError as exc:
        raise ModelLoadError(f"{name}: {exc}") from None
    except (OSError, struct.error) as exc:
        raise ModelLoadError(f"{name}: cannot be read as a GGUF file ({exc})") from None


def is_gguf_path(path) -> bool:
    return str(path).lower().endswith(".gguf")
