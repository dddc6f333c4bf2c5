"""A checked GGUF file's tensors as torch tensors, mapped from the offsets ``gguf_header`` checked.

Why not ``gguf.GGUFReader``: it re-parses the whole header without budgets and builds numpy objects per metadata
array item (a crafted 8 MB file of 999,999 empty strings took it 45 s and 1.6 GB), while the scan already knows
every tensor's offset, type and byte count, all checked to lie inside the file. A ``numpy.memmap`` of the file
gives those bytes. The file must still be the version the header was read from (same size and mtime), else it
is refused by name. Each tensor is copied out of the map, so the model holds its own memory and the map is
dropped after the load: unquantized tensors (F32/F16/BF16) in their own dtype and logical shape, quantized ones
as the raw ``uint8`` blocks in the stored byte shape (rows x bytes per row) that diffusers' ``GGUFParameter``
holds, never dequantised here.
"""

from __future__ import annotations

import os

from ..errors import ModelLoadError
from .file_identity import stat_identity
from .gguf_header import GGUFHeader, GGUFTensor
from .regular_files import open_regular

# numpy dtype of each unquantized type's elements (BF16 is read as its raw 16 bits, viewed as torch.bfloat16)
_ELEMENT_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<i2"}


def read_gguf_tensors(header: GGUFHeader, name: str, names=None) -> dict:
    """``{tensor name: torch tensor}`` of ``names`` (default: every tensor) of the file ``header`` was read from."""
    import numpy

    wanted = list(header.tensors) if names is None else list(names)
    try:
        with open_regular(header.path) as handle:
            if header.identity and stat_identity(os.fstat(handle.fileno())) != header.identity:
                raise ModelLoadError(f"{name}: the file changed since its header was checked; load it again")
            mapped = numpy.memmap(handle, dtype=numpy.uint8, mode="r")
            out = {key: _to_torch(header.tensors[key], mapped, name) for key in wanted}
            del mapped
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{name}: its tensor data cannot be read ({exc})") from None
    return out


def _to_torch(tensor: GGUFTensor, mapped, name: str):
    import numpy
    import torch

    raw = numpy.array(mapped[tensor.offset:tensor.offset + tensor.n_bytes], copy=True)
    if len(raw) != tensor.n_bytes:  # the scan checked the size; a file truncated since is refused here
        raise ModelLoadError(f"{name}: tensor {tensor.name!r} ends past the end of the file; it changed while it was read")
    if tensor.quantized:  # uint8, (*stored_shape[:-1], bytes per row)
        return torch.from_numpy(raw.reshape(*tensor.stored_shape[:-1], -1))
    values = torch.from_numpy(raw.view(_ELEMENT_DTYPES[tensor.type_name]))
    if tensor.type_name == "BF16":
        values = values.view(torch.bfloat16)
    return values.reshape(tensor.shape)
