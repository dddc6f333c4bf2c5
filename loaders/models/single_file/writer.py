"""Write a safetensors file one tensor at a time (the header first, from names, dtypes and shapes known up front).

Why not ``safetensors.torch.save_file``: it needs every tensor in memory at once, and a merged 14B expert is
28 GB in bf16. ``lorabind merge`` on single files knows each output tensor's dtype and shape before it reads a
weight (from the source header and the merge plan), so it writes the header, then streams each fused tensor
and drops it: peak memory is one tensor plus its float32 temporary. The layout is the format's own: an 8-byte
little-endian header length, the JSON header (``dtype``, ``shape``, ``data_offsets`` per tensor, plus
``__metadata__``) padded with spaces to a multiple of 8, then the tensors' bytes back to back in header order.
"""

from __future__ import annotations

import json
import struct

SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
                      "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32",
                      "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
_ITEM_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}


def dtype_code(dtype) -> str:
    """A torch dtype's safetensors name ("BF16", "F8_E4M3", ...)."""
    return SAFETENSORS_DTYPES[str(dtype).replace("torch.", "")]


class StreamingWriter:
    """``entries``: ``{name: (safetensors dtype, shape)}`` in the order the tensors will be written."""

    def __init__(self, path: str, entries: dict, metadata: dict):
        self._order = list(entries)
        self._entries = entries
        header, offset = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}, 0
        for name, (code, shape) in entries.items():
            size = _ITEM_BYTES[code]
            for dim in shape:
                size *= int(dim)
            header[name] = {"dtype": code, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + size]}
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)
        self._handle = open(path, "wb")
        self._handle.write(struct.pack("<Q", len(text)) + text)
        self._next = 0

    def write(self, name: str, tensor) -> None:
        """The next tensor, in ``entries`` order, of exactly the declared dtype and shape."""
        import torch

        expected = self._order[self._next] if self._next < len(self._order) else None
        code, shape = self._entries.get(name, (None, None))
        if name != expected or dtype_code(tensor.dtype) != code or list(tensor.shape) != [int(d) for d in shape]:
            raise RuntimeError(f"writer: got {name} {tensor.dtype} {list(tensor.shape)}, expected {expected} "
                               f"{self._entries.get(expected)}")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        self._handle.write(flat.view(torch.uint8).numpy().tobytes())
        self._next += 1

    def close(self) -> None:
        self._handle.close()
        if self._next != len(self._order):
            raise RuntimeError(f"writer: {len(self._order) - self._next} declared tensor(s) never written")

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            self._handle.close()
            return False
        self.close()
        return False
