"""GGUF test models built in memory: a tiny diffusers transformer whose Linear weights are quantized with the
``gguf`` package and held as diffusers' ``GGUFLinear`` / ``GGUFParameter`` (what a loaded GGUF denoiser is)."""

from __future__ import annotations

import torch

# Linears a diffusers model reads the dtype of, to cast its input (Wan's time embedder casts the timestep to its
# first weight's dtype: uint8 bytes would truncate it), are kept unquantized
KEPT_UNQUANTIZED = ("time_embedder.",)


def quantize_linears(root: torch.nn.Module, quant_type=None, compute_dtype=torch.float32) -> list[str]:
    """Replace every Linear of ``root`` whose rows fit the type's blocks by a ``GGUFLinear`` with the quantized
    bytes (as published GGUF files do, a row that does not fit the block size stays unquantized); the names."""
    import gguf
    from diffusers.quantizers.gguf.utils import GGML_QUANT_SIZES, GGUFLinear, GGUFParameter

    quant_type = gguf.GGMLQuantizationType.Q8_0 if quant_type is None else quant_type
    block_size = GGML_QUANT_SIZES[quant_type][0]
    names = []
    for name, module in list(root.named_modules()):
        if type(module) is not torch.nn.Linear or module.in_features % block_size or \
                any(part in name for part in KEPT_UNQUANTIZED):
            continue
        data = gguf.quants.quantize(module.weight.detach().float().numpy(), quant_type)
        layer = GGUFLinear(module.in_features, module.out_features, module.bias is not None,
                           compute_dtype=compute_dtype)
        layer.weight = GGUFParameter(torch.from_numpy(data), quant_type=quant_type)
        if module.bias is not None:
            layer.bias = torch.nn.Parameter(module.bias.detach().clone(), requires_grad=False)
        layer.requires_grad_(False)
        owner, _, leaf = name.rpartition(".")
        setattr(root.get_submodule(owner) if owner else root, leaf, layer)
        names.append(name)
    return names


def gguf_bytes(root: torch.nn.Module) -> dict:
    """{parameter name: a copy of its raw GGUF bytes (uint8)} of every quantized weight under ``root``."""
    from lorabind.loaders import gguf_weights

    return {name: gguf_weights.raw_bytes(p).clone() for name, p in root.named_parameters()
            if gguf_weights.is_quantized(p)}


def reference_dequant(param) -> torch.Tensor:
    """The ``gguf`` package's own dequantiser (numpy), in float64: the reference a test compares against."""
    import gguf

    from lorabind.loaders import gguf_weights

    values = gguf.quants.dequantize(gguf_weights.raw_bytes(param).numpy(), param.quant_type)
    return torch.from_numpy(values).double().reshape(tuple(param.quant_shape))


def package_dequant(tensor, raw) -> torch.Tensor:
    """A header tensor's float32 values in its logical shape by the ``gguf`` package's own dequantiser (numpy): the
    independent reference the engine's decoder (diffusers' block decoders, ``gguf_weights``) is compared with."""
    import gguf

    if not tensor.quantized:
        return raw.float().reshape(tensor.shape)
    values = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[tensor.type_name])
    return torch.from_numpy(values.astype("float32", copy=False)).reshape(tensor.shape)
