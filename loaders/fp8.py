"""fp8 weights in single files: the two ComfyUI formats, and how lorabind computes with them.

Formats (read from ComfyUI ``comfy/utils.py::convert_old_quants`` and ``comfy/ops.py``):
- ``fp8_e4m3fn``: weights stored as ``F8_E4M3``, value = the fp8 number.
- fp8 *scaled* (``*_fp8_scaled`` / ``*_fp8_e4m3fn_scaled``): a ``scaled_fp8`` marker tensor (empty, fp8 dtype)
  and, next to each fp8 weight, ``<module>.scale_weight`` (float32 scalar): value = fp8 number x scale.
  Newer ComfyUI writes the same thing as ``<module>.weight_scale`` plus a ``<module>.comfy_quant`` JSON tensor;
  both spellings are read. Optional ``scale_input`` tensors (activation scales for fp8 matmuls) are ignored: we
  compute in bf16.

In memory the weights stay fp8 (one byte per weight, the file's exact bytes) and every module holding one gets
a forward hook (``forward_hooks.FP8_COMPUTE``) that swaps in the dequantized bf16 weight (fp8 -> bf16 is exact,
then x scale) for the call and puts the stored fp8 tensor back after it, also when the call raises. Why our
own hook instead of diffusers' layerwise casting: that hook casts *every* parameter of a module to the storage
dtype (biases too, which the files keep in bf16) and cannot apply a per-tensor scale. The cost is one dequantized
weight per running module, not a second copy of the model.

Fusing a LoRA into an fp8 weight (``patching.write_patched``): the value (fp8 x scale) plus every contribution
is computed in float32 and rounded to fp8 ONCE, keeping the file's scale, saturating at +-448. Rounding is
``nearest`` (round half to even, torch's cast) by default, or ``stochastic``: seeded per tensor with the CRC32
of its parameter id (as ComfyUI seeds per key), so the same fuse always gives the same bytes. Unbinding copies
the original fp8 bytes back. peft adapters over fp8 weights keep their own weights in the compute dtype
(``compute_dtype``, asked by ``binding.peft_adapters``) and never touch the stored fp8 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from . import forward_hooks
from .errors import ModelLoadError

SCALED_MARKER = "scaled_fp8"
SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
IGNORED_SUFFIXES = (".scale_input", ".input_scale", ".comfy_quant")
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize(weight, *, scaled: bool):
    """(fp8 tensor, scale or None) rounding to nearest; scaled: per-tensor scale = amax / 448 (ComfyUI's choice)."""
    import torch

    weight = weight.float()
    if not scaled:
        return weight.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), None
    amax = weight.abs().max().clamp_min(1e-12)
    scale = (amax / FP8_MAX).to(torch.float32)
    return (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.reshape(())


def dequantize(stored, scale, dtype):
    """fp8 (x scale) in ``dtype``: exact for bf16/fp32 without a scale (bf16 holds every e4m3 value)."""
    if scale is None:
        return stored.to(dtype)
    return (stored.float() * scale.float()).to(dtype)


def checked_scale(scale, file_name: str, key: str):
    """The file's ``scale_weight`` as a float32 scalar, or ``ModelLoadError`` naming the file and key: one finite,
    positive number. Why at load: a NaN/Inf scale turns every weight it scales into NaN (a "successful" black
    image), a zero one erases the layer, a negative one flips it, and a non-scalar one fails only inside the
    sampler, far from the file that caused it."""
    if scale.numel() != 1:
        raise ModelLoadError(f"{file_name}: {key} has shape {tuple(scale.shape)}; an fp8 scale is one number")
    value = scale.float().reshape(())
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ModelLoadError(f"{file_name}: {key} is {number}; an fp8 scale must be a finite positive number "
                             "(the file is damaged)")
    return value


def refuse_nan(stored, file_name: str, key: str) -> None:
    """``ModelLoadError`` naming the file and key when fp8 weights hold NaN (e4m3fn has no infinity; its NaNs are
    the bytes 0x7F and 0xFF): they would make the whole output NaN. Two max reductions find them (0x7F is the
    largest byte as int8, 0xFF as uint8): about a third of the cost of copying the tensor once, where a masked
    compare costs several copies; the NaNs are counted only when there are some."""
    import torch


    as_unsigned = stored.view(torch.uint8)
    if int(stored.view(torch.int8).max()) != 0x7F and int(as_unsigned.max()) != 0xFF:
        return
    count = int(((as_unsigned & 0x7F) == 0x7F).sum())
    raise ModelLoadError(f"{file_name}: {key} holds {count} NaN fp8 value(s); the file is damaged")


ROUNDINGS = ("nearest", "stochastic")


@dataclass
class StoredWeight:
    """A parameter kept as its file's fp8 bytes, with the file's scale (None: plain fp8_e4m3fn)."""
    stored: object  # torch.nn.Parameter in float8_e4m3fn
    scale: Optional[object]
    rounding: str = "nearest"  # how a fuse rounds into it (see the module docstring)


@dataclass
class Fp8Compute:
    """What the fp8 hook of one module keeps: the dtype it computes in and its fp8-stored parameters."""
    compute_dtype: object
    weights: dict = field(default_factory=dict)  # parameter name -> StoredWeight


def _dequantize_in(module, compute: Fp8Compute, args, kwargs):
    import torch

    for name, entry in compute.weights.items():
        module._parameters[name] = torch.nn.Parameter(
            dequantize(entry.stored, entry.scale, compute.compute_dtype), requires_grad=False)
    return args, kwargs


def _put_back(module, compute: Fp8Compute) -> None:
    for name, entry in compute.weights.items():
        module._parameters[name] = entry.stored


def keep_fp8(module, name: str, stored, scale, compute_dtype, rounding: str = "nearest") -> None:
    """Store ``module.<name>`` as fp8 and compute with its dequantized value (see the module docstring)."""
    import torch

    param = torch.nn.Parameter(stored, requires_grad=False)
    module._parameters[name] = param
    compute = forward_hooks.state_of(module, forward_hooks.FP8_COMPUTE)
    if compute is None:
        compute = Fp8Compute(compute_dtype)
        forward_hooks.attach(module, forward_hooks.FP8_COMPUTE, compute, before=_dequantize_in, after=_put_back)
    compute.weights[name] = StoredWeight(param, scale, rounding)


def stored_weights(root) -> dict:
    """``{qualified parameter name: StoredWeight}`` of every fp8-stored parameter under ``root`` (what tensor
    parallelism refuses to split: the scales are laid out for the whole weight)."""
    found = {}
    for module_name, module in root.named_modules():
        for name, entry in _weights_of(module).items():
            found[f"{module_name}.{name}" if module_name else name] = entry
    return found


def stored_weight(module, name: str) -> Optional[StoredWeight]:
    """The fp8 storage record of ``module.<name>``, or None for an ordinary parameter."""
    return _weights_of(module).get(name)


def _weights_of(module) -> dict:
    compute = forward_hooks.state_of(module, forward_hooks.FP8_COMPUTE)
    return compute.weights if compute is not None else {}


def round_to_fp8(values, rounding: str, seed_key: str, generator=None):
    """float32 ``values`` -> float8_e4m3fn, saturating at +-448; ``stochastic`` picks the upper or lower fp8
    neighbour with probability proportional to closeness. Pass one ``generator`` (``seeded_generator``) for
    all chunks of a tensor so the draw follows the tensor's fixed chunking."""
    import torch

    values = values.clamp(-FP8_MAX, FP8_MAX)
    nearest = values.to(torch.float8_e4m3fn)
    if rounding == "nearest":
        return nearest
    back = nearest.float()
    bits = nearest.view(torch.uint8).to(torch.int16)
    sign = torch.where(bits & 0x7F == 0, (values < 0).to(torch.int16) * 0x80, bits & 0x80)
    away = values.abs() > back.abs()  # the other neighbour lies further from zero
    magnitude = ((bits & 0x7F) + torch.where(away, 1, -1)).clamp(0, 0x7E)
    other = (sign | magnitude).to(torch.uint8).view(torch.float8_e4m3fn).float()
    gap = (other - back).abs()
    chance = torch.where(gap > 0, (values - back).abs() / gap.clamp_min(1e-30), torch.zeros_like(gap))
    draw = torch.rand(values.shape, generator=generator).to(values.device)
    return torch.where(draw < chance, other, back).to(torch.float8_e4m3fn)


def seeded_generator(seed_key: str):
    """A CPU generator seeded by the CRC32 of ``seed_key`` (a parameter id)."""
    import zlib

    import torch

    return torch.Generator().manual_seed(zlib.crc32(seed_key.encode("utf-8")))


def compute_dtype(module):
    """The dtype an fp8-stored layer computes in, or None for a layer that stores no fp8 weight."""
    compute = forward_hooks.state_of(module, forward_hooks.FP8_COMPUTE)
    return compute.compute_dtype if compute is not None else None
