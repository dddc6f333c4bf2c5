"""A checked GGUF file's tensors as torch tensors, through ``gguf.GGUFReader``'s memory map.

Only a header that ``gguf_header.read_gguf_header`` accepted comes here (the reader itself has no budgets). The
reader re-parses that header; its tensor table must agree with ours (a file replaced between the two reads is
refused by name). Each tensor is copied out of the map, so the model holds its own memory and the map is
dropped after the load: unquantized tensors (F32/F16/BF16) in their own dtype and logical shape, quantized ones
as the raw ``uint8`` blocks in the stored byte shape (rows x bytes per row) that diffusers' ``GGUFParameter``
holds, never dequantised here.
"""

from __future__ import annotations

import warnings

from ..errors import ModelLoadError
from .gguf_header import GGUFHeader, GGUFTensor


def read_gguf_tensors(header: GGUFHeader, name: str, names=None) -> dict:
    """``{tensor name: torch tensor}`` of ``names`` (default: every tensor) of the file ``header`` was read from."""
    import gguf

    wanted = list(header.tensors) if names is None else list(names)
    try:
        reader = gguf.GGUFReader(header.path)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ModelLoadError(f"{name}: the gguf package cannot read the file ({exc}); it changed since its header "
                             "was checked, or is damaged") from None
    found = {tensor.name: tensor for tensor in reader.tensors}
    out = {}
    for key in wanted:
        ours, theirs = header.tensors[key], found.get(key)
        if theirs is None or theirs.data_offset != ours.offset or theirs.tensor_type.name != ours.type_name:
            raise ModelLoadError(f"{name}: tensor {key!r} is not where its header put it; the file changed while "
                                 "it was read")
        out[key] = _to_torch(ours, theirs.data)
    del reader, found
    return out


def _to_torch(tensor: GGUFTensor, data):
    import numpy
    import torch

    with warnings.catch_warnings():  # the copy below makes the tensor writable; the map is read-only
        warnings.simplefilter("ignore", UserWarning)
        copied = torch.from_numpy(numpy.array(data, copy=True))
    if tensor.type_name == "BF16":  # the reader gives BF16 as raw bytes
        return copied.view(torch.bfloat16).reshape(tensor.shape)
    if not tensor.quantized:
        return copied.reshape(tensor.shape)
    return copied  # uint8, (*stored_shape[:-1], bytes per row)

