"""GGUF-quantized parameters as diffusers keeps them: what a layer's weight IS when it is stored quantized.

A GGUF denoiser loads as an ordinary diffusers model whose quantized Linear layers are diffusers' ``GGUFLinear``
holding a ``GGUFParameter``: the file's raw block bytes (uint8, shape ``[rows, bytes per row]``) tagged with
their ``quant_type``, the logical ``[out, in]`` shape in ``quant_shape``. This leaf is the one place that knows
that, so the LoRA accounting (below the binding) and the binding check a LoRA against the logical shape, and
the binding can tell a weight patched at dequantise time from one patched in place. Why duck-typed on
``quant_type``/``quant_shape`` instead of ``isinstance(GGUFParameter)``: importing diffusers' GGUF module pulls
in the ``gguf`` package; a weight that is not quantized must cost nothing to ask about.
"""

from __future__ import annotations


def is_quantized(tensor) -> bool:
    """True for a GGUF-quantized parameter (raw block bytes with a quantization type)."""
    return getattr(tensor, "quant_type", None) is not None and getattr(tensor, "quant_shape", None) is not None


def logical_shape(tensor) -> tuple:
    """The shape the weight has as a matrix: ``quant_shape`` for GGUF bytes, the tensor's own shape otherwise."""
    return tuple(tensor.quant_shape) if is_quantized(tensor) else tuple(tensor.shape)


def compute_dtype(module):
    """The dtype a GGUF layer (diffusers' ``GGUFLinear``) computes in, or None for a layer not stored as GGUF."""
    return getattr(module, "compute_dtype", None) if is_quantized(module._parameters.get("weight")) else None


def raw_bytes(tensor):
    """The stored bytes of a GGUF parameter as a plain uint8 tensor (a view: nothing copied)."""
    import torch

    return torch.Tensor._make_subclass(torch.Tensor, tensor.detach(), False).view(torch.uint8)


def dequantize(tensor):
    """The weight's value in float32, on the tensor's device.

    Why not diffusers' ``dequantize_gguf_tensor``: it computes in the block scale's dtype (float16 for Q8_0, whose
    ``d * q`` products then round), while a LoRA patch must start from the exact value; the same block
    decoders are asked for float32, where Q8_0/Q4_0 products are exact."""
    return dequantize_blocks(raw_bytes(tensor), tensor.quant_type, logical_shape(tensor))


def dequantize_blocks(raw, quant_type, shape: tuple):
    """Raw GGUF block bytes (uint8) of ``quant_type`` (a ``gguf.GGMLQuantizationType``) as float32 values of
    ``shape``: the one decoder for a weight dequantised at load and one dequantised at each forward, so both
    see the same value."""
    import torch
    from diffusers.quantizers.gguf.utils import GGML_QUANT_SIZES, dequantize_functions

    block_size, type_size = GGML_QUANT_SIZES[quant_type]
    blocks = raw.reshape(-1, type_size)
    return dequantize_functions[quant_type](blocks, block_size, type_size, dtype=torch.float32).reshape(shape)
