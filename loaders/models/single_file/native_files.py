"""Write a diffusers state dict as a native single file, in bf16, ``fp8_e4m3fn`` or fp8 scaled.

Only the tiny-model builder uses this (``lorabind models build-tiny``); it is the inverse of loading. Which
tensors become fp8 follows ComfyUI's published files: the 2-D projection weights inside the repeated blocks;
norms, biases, embeddings and the head stay bf16. Parameters of the modules a model class keeps in float32
(``_keep_in_fp32_modules``: Wan's modulation tables and norms, umt5's ``wo``) are written in float32, so a bf16
file loads to exactly the state ``from_pretrained(dtype=bfloat16)`` gives from the full-precision folder.
"""

from __future__ import annotations

from ... import fp8
from ...io.key_layouts import KeyLayout

PRECISIONS = ("bf16", "fp8_e4m3fn", "fp8_scaled")


def keeps_fp32(diffusers_key: str, keep_fp32_modules) -> bool:
    """diffusers' rule: a parameter whose module path has one of the names stays float32."""
    return any(name in diffusers_key.split(".") for name in keep_fp32_modules or ())


def native_tensors(state_dict: dict, layout: KeyLayout, *, precision: str = "bf16",
                   quantized_prefix: str = "blocks.", keep_fp32_modules=()) -> dict:
    """``{native key: tensor}`` of ``state_dict`` in ``precision`` (see the module docstring)."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose one of {PRECISIONS}")
    out = {}
    for native, parts in layout.native_plan(state_dict).items():
        tensor = layout.join(native, [state_dict[k] for k in parts])
        if keeps_fp32(parts[0], keep_fp32_modules):
            out[native] = tensor.float()
            continue
        eligible = (precision != "bf16" and native.startswith(quantized_prefix) and native.endswith(".weight")
                    and tensor.ndim == 2)
        if not eligible:
            out[native] = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
            continue
        stored, scale = fp8.quantize(tensor.to(torch.bfloat16), scaled=precision == "fp8_scaled")
        out[native] = stored
        if scale is not None:
            out[native[: -len(".weight")] + ".scale_weight"] = scale
    if precision == "fp8_scaled":
        out[fp8.SCALED_MARKER] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out
