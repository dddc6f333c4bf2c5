"""Build a denoiser from a GGUF file: diffusers' GGUF quantization support, driven by our detection and layouts.

The module is built on the meta device from the shipped config, as for any single file, then each tensor of the
file is placed by the component's native layout (``layouts``: ComfyUI's key names, which the published GGUFs
use). A quantized 2-D weight of an ``nn.Linear`` becomes diffusers' ``GGUFParameter`` (the file's raw blocks,
kept quantized in memory) in a ``GGUFLinear`` that dequantises it at every forward in the compute dtype; F32,
F16 and BF16 tensors load as ordinary parameters exactly as ``loading.load_component`` loads a bf16 file
(compute dtype, float32 where the model class keeps modules in float32).

Why not ``from_single_file(..., quantization_config=GGUFQuantizationConfig(...))``: it reads the whole file into
a state dict, converts the keys with diffusers' own converters (a second pass over every tensor), and knows
nothing of our detection, expert pairs or the messages that name a file and key. The pieces it is built from
(``GGUFParameter``, ``GGUFLinear``, ``dequantize_gguf_tensor``) are used as they are.

Quantized tensors that cannot stay quantized are dequantised at load, each for a stated reason: a weight whose
module is not an ``nn.Linear`` (``GGUFLinear`` replaces Linear layers only; a quantized conv or embedding would
be read as bytes), a weight the file stores reshaped (ComfyUI-GGUF's ``comfy.gguf.orig_shape``: its blocks run
across rows, so the Linear's rows are not whole blocks), one split across several diffusers tensors (a fused
layout rule), and one of a module the class keeps in float32.
"""

from __future__ import annotations

from ... import gguf_weights
from ...errors import ModelLoadError
from ...io.gguf_header import GGUFTensor, read_gguf_header
from ...io.gguf_tensors import read_gguf_tensors
from .detect import Detected
from .loading import batches, build_empty, check_all_loaded, check_file_keys, fp32_modules, ignored_key, owner, place
from .native_files import keeps_fp32


def load_gguf_component(detected: Detected, *, dtype=None, fp8_rounding: str = "nearest"):
    """The denoiser module of one detected GGUF file (``fp8_rounding`` is accepted for the single-file loader's
    signature; GGUF weights are never rounded into). ``ModelLoadError`` naming the file and key on any mismatch;
    the module is returned only whole."""
    import torch

    compute = dtype or torch.bfloat16
    header = read_gguf_header(detected.path, detected.name)
    model = build_empty(detected)
    layout = detected.kind.layout(detected.config)
    plan = layout.native_plan(model.state_dict(keep_vars=True))
    keep = fp32_modules(type(model), detected, compute)
    native_keys = check_file_keys(detected, header.tensors, plan, layout)
    wanted = {detected.prefix + k: header.tensors[detected.prefix + k].n_bytes for k in sorted(native_keys)
              if not ignored_key(k, layout)}
    for batch in batches(wanted):  # a fresh map per batch: pages copied out are unmapped (see ``loading``)
        for file_key, raw in read_gguf_tensors(header, detected.name, batch).items():
            native_key, info = file_key[len(detected.prefix):], header.tensors[file_key]
            keys = plan[native_key]
            if info.quantized and _stays_quantized(model, layout, native_key, keys, info, keep):
                _place_quantized(model, keys[0], raw, info, compute, detected)
                continue
            value = _dequantized(info, raw) if info.quantized else raw
            for key, part in layout.split(native_key, value, keys).items():
                place(model, key, part, None, compute, keeps_fp32(key, keep), detected, fp8_rounding)
    check_all_loaded(model, detected)
    return model.eval().requires_grad_(False)


def gguf_stored_bytes(detected: Detected, model) -> dict:
    """{diffusers parameter name: bytes} of the weights ``load_gguf_component`` keeps quantized, from the
    header only (``model`` built on the meta device), so a memory plan sizes them as they are held."""
    import torch

    header = read_gguf_header(detected.path, detected.name)
    layout = detected.kind.layout(detected.config)
    plan = layout.native_plan(model.state_dict(keep_vars=True))
    keep = fp32_modules(type(model), detected, torch.bfloat16)
    stored = {}
    for name, info in header.tensors.items():
        native_key = name[len(detected.prefix):]
        keys = plan.get(native_key) if name.startswith(detected.prefix) else None
        if keys and info.quantized and _stays_quantized(model, layout, native_key, keys, info, keep):
            stored[keys[0]] = info.n_bytes
    return stored


def _stays_quantized(model, layout, native_key: str, keys: tuple, info: GGUFTensor, keep: tuple) -> bool:
    """A quantized tensor that is exactly one Linear's weight, stored in its own shape (see the module
    docstring for the cases that are dequantised at load instead)."""
    import torch

    if len(keys) != 1 or layout.fused_rule(native_key) is not None or not keys[0].endswith(".weight"):
        return False
    module, leaf = owner(model, keys[0])
    return (leaf == "weight" and isinstance(module, torch.nn.Linear) and info.shape == info.stored_shape
            and info.shape == (module.out_features, module.in_features) and not keeps_fp32(keys[0], keep))


def _dequantized(info: GGUFTensor, raw):
    """A quantized tensor that cannot stay quantized (see ``_stays_quantized``), as float32 values."""
    import gguf

    return gguf_weights.dequantize_blocks(raw, gguf.GGMLQuantizationType[info.type_name], info.shape)


def _place_quantized(model, key: str, raw, info: GGUFTensor, compute, detected: Detected) -> None:
    """Swap the Linear for diffusers' ``GGUFLinear`` (built on the meta device: no float weight is allocated)
    holding the raw blocks as a ``GGUFParameter``; its bias, loaded or not yet, moves over with it."""
    import gguf
    import torch
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter

    module_path, _, _ = key.rpartition(".")
    linear = model.get_submodule(module_path)
    expected_bytes = info.n_bytes // info.shape[0]
    if tuple(raw.shape) != (info.shape[0], expected_bytes):
        raise ModelLoadError(f"{detected.name}: {key} holds {tuple(raw.shape)} bytes, {info.type_name} "
                             f"{list(info.shape)} needs {(info.shape[0], expected_bytes)}")
    with torch.device("meta"):
        quantized = GGUFLinear(linear.in_features, linear.out_features, linear.bias is not None,
                               compute_dtype=compute)
    quantized.source_cls = type(linear)  # as diffusers' own replacement records it
    quantized.weight = GGUFParameter(raw, quant_type=gguf.GGMLQuantizationType[info.type_name])
    if linear.bias is not None:
        quantized.bias = linear.bias
    parent, _, child = module_path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, quantized)
