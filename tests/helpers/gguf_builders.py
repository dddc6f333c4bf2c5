"""Hand-built GGUF bytes for the hostile-file tests: every field written explicitly, so a test can make any
count, length, type or offset lie."""

from __future__ import annotations

import struct

F32, F16, Q8_0 = 0, 1, 8


def gguf_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def kv_string(key: str, value: str) -> bytes:
    return gguf_string(key) + struct.pack("<I", 8) + gguf_string(value)


def kv_u32(key: str, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<II", 4, value)


def kv_array_header(key: str, item_type: int, count: int) -> bytes:
    """A metadata array's key and header only: the items (if any) follow."""
    return gguf_string(key) + struct.pack("<IIQ", 9, item_type, count)


def tensor_info(name: str, dims, type_id: int, offset: int) -> bytes:
    """``dims`` fastest-varying first, as the format stores them."""
    return gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


def gguf_file(kvs=(), tensors=(), data: bytes = b"", *, tensor_count=None, kv_count=None, version: int = 3,
              alignment: int = 32) -> bytes:
    """A whole file: header, the given kv and tensor-info byte strings, padding, ``data``."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if tensor_count is None else tensor_count,
                                 len(kvs) if kv_count is None else kv_count)
    head += b"".join(kvs) + b"".join(tensors)
    head += b"\0" * (-len(head) % alignment)
    return head + data


def one_f32_tensor_file(name: str = "blocks.0.ffn.2.weight", rows: int = 2, cols: int = 4) -> bytes:
    """A valid file with one F32 tensor of ``rows x cols`` and a ``general.architecture``."""
    data = struct.pack(f"<{rows * cols}f", *[float(i) for i in range(rows * cols)])
    return gguf_file([kv_string("general.architecture", "wan")], [tensor_info(name, (cols, rows), F32, 0)], data)
