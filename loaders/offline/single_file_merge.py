"""Merge LoRAs into ComfyUI's single files (``lorabind merge --model FILE.safetensors``): one file in, one out.

What people have is single files ("bake the lightx2v pair into my fp8 Wan2.2 experts"), and LightX2V's own
merger writes single files in bf16 by default. The arithmetic is the folder merge's (``loaders.offline.merging``:
keys accounted by ``prepare_lora`` on the component built on the meta device, every fused value the exact
float32 sum rounded once by ``fused_rows.write_patched``); what differs is reading and writing the native layout:

- each file is read through its layout (``layouts``: native names, fused tensors split), fp8 weights as their
  value (fp8 x ``scale_weight``), and written back in the same names and key prefix;
- ``dtype`` is the output's: ``bf16`` (default), ``fp16``, ``fp32``, or ``fp8_e4m3fn``: then every weight the
  source kept fp8 (or, from a bf16 source, every 2-D weight inside the repeated blocks, as the published fp8
  files choose) is stored fp8 with a per-tensor ``scale_weight`` (the published fp8 scaled format, with its
  ``scaled_fp8`` marker): the source's scale where the fused value fits it, else amax / 448 (``to_fp8``).
  Parameters the model class keeps in float32 stay float32, as in the published files and as the loader
  computes them;
- what was fused and the LoRAs' contracts go into the file's metadata (``_lorabind``, JSON), where
  ``baked_file_contracts`` reads them back, so a merged file enforces its contract when loaded;
- the output is streamed (``writer``) and written by ``safe_output``'s rule, one tensor in memory at a time.

Two expert files (high-noise first) merge in one run, each LoRA into the file its component names.
"""

from __future__ import annotations

import json
import os
import re

from .. import fp8
from ..binding.fused_rows import write_patched
from ..binding.patching import plan_state_keys
from ..contracts.baked import INDEX_KEY as BAKED_KEY
from ..errors import LoraBindError
from ..families import family_by_id
from ..io.safe_output import check_output, output_metadata, safe_output
from ..models.single_file import catalog
from ..models.single_file.baked_files import WRITTEN_BY
from ..models.single_file.detect import Detected, check_denoisers, detect
from ..models.single_file.loading import build_empty
from ..models.single_file.native_files import keeps_fp32
from ..models.single_file.shard_folders import open_weights
from ..models.single_file.writer import StreamingWriter, dtype_code
from .merging import MetaModel, baked_record, placed_requests, prepare_layers

FP8_OUTPUT = "fp8_e4m3fn"
OUTPUT_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", FP8_OUTPUT: "float8_e4m3fn"}
DEFAULT_DTYPE = "bf16"
_BLOCK_INDEX = re.compile(r"\.\d+\.")  # a tensor inside a repeated block ("blocks.3.", "transformer_blocks.0.")


class MergeInputError(LoraBindError):
    """A single-file merge given files it cannot merge (not a denoiser, outputs that do not pair with inputs)."""


def merge_into_files(model_files: list, loras: list, out_files: list, *, component=None,
                     dtype: str = DEFAULT_DTYPE, lenient: bool = False, overwrite: bool = False) -> dict:
    """Fuse ``loras`` (``merging.placed_requests`` items) into the denoiser ``model_files`` and write
    ``out_files`` (one each, in order). Everything is checked (files, slots, keys, shapes, outputs) before a
    byte is written; a failure leaves every output as it was."""
    import torch


    if dtype not in OUTPUT_DTYPES:
        raise MergeInputError(f"--dtype {dtype}: choose one of {sorted(OUTPUT_DTYPES)}")
    named = _named_denoisers(model_files, out_files)
    family = family_by_id(next(iter(named.values())).family)
    model_family = family.model_families[-1 if len(named) > 1 else 0]
    parts_index = {comp: [d.kind.library, catalog.model_class(d.kind).__name__] for comp, d in named.items()}
    requests = placed_requests(parts_index, model_family, next(iter(named)), loras, component)
    inputs = [*model_files, *(path for _, path, _ in requests)]
    outputs = dict(zip(named, out_files))
    for out in outputs.values():
        check_output(out, kind="file", inputs=inputs, overwrite=overwrite)

    model = MetaModel(name=" + ".join(d.name for d in named.values()), family=model_family,
                      components={comp: build_empty(d) for comp, d in named.items()})
    layers, fuses, warnings, contracts = prepare_layers(model, requests, lenient=lenient)
    plans = {comp: plan_state_keys(comp, model.components[comp], layers[comp]) for comp in named}
    out_dtype = getattr(torch, OUTPUT_DTYPES[dtype])
    written = {}
    for comp, detected in named.items():
        record = baked_record([f for f in fuses if f["component"] == comp],
                              [c for where, c in contracts if where == comp])
        with safe_output(outputs[comp], written_by=WRITTEN_BY, kind="file", inputs=inputs,
                         overwrite=overwrite) as staged:
            written[comp] = _write_file(detected, model.components[comp], plans[comp], staged, out_dtype, record)
    return {"model": [d.name for d in named.values()], "out": [os.path.abspath(o) for o in out_files],
            "components": {comp: os.path.basename(outputs[comp]) for comp in named}, "dtype": dtype,
            "tensors_fused": sum(len(p) for p in plans.values()), "tensors_written": written,
            "contracts": [c.describe() for _, c in contracts], "fuses": fuses, "warnings": warnings}


def _named_denoisers(model_files: list, out_files: list) -> dict:
    """{component: Detected} of the model files, named as the family names them (two experts: high first)."""
    if len(out_files) != len(model_files):
        raise MergeInputError(f"give one --out per --model file: {len(model_files)} model file(s), "
                              f"{len(out_files)} --out")
    if len({os.path.abspath(o) for o in out_files}) != len(out_files):
        raise MergeInputError(f"two --out paths are the same file: {out_files}")
    for out in out_files:
        if not str(out).endswith(".safetensors"):
            raise MergeInputError(f"--out {out}: a single-file merge writes a .safetensors file")
    denoisers = [detect(path, os.path.basename(path)) for path in model_files]
    for item in denoisers:
        if item.is_gguf:  # its quantized blocks are never rewritten: a GGUF model takes LoRAs at run time
            raise MergeInputError(f"{item.name}: a GGUF file ({item.describe()}); merge writes safetensors single "
                                  "files from safetensors ones. Fuse the LoRA at run time instead (the checkpoint "
                                  "loader reads GGUF denoisers), or merge into the bf16/fp8 file")
        if item.role != "denoiser":
            raise MergeInputError(f"{item.name}: merge takes denoiser files, this is a {item.role.replace('_', ' ')} "
                                  f"({item.describe()})")
    check_denoisers(denoisers)
    parts = family_by_id(denoisers[0].family).layout.single_file_parts(denoisers, None, None)
    return {comp: part for comp, part in parts.items() if any(part is d for d in denoisers)}


def _write_file(detected: Detected, module, plan: dict, path: str, out_dtype, record: dict) -> int:
    """Stream ``detected``'s tensors, fused by ``plan``, into ``path`` at ``out_dtype``; returns the count."""
    layout = detected.kind.layout(detected.config)
    native_plan = layout.native_plan(module.state_dict(keep_vars=True))
    keep = tuple(getattr(type(module), "_keep_in_fp32_modules", None) or ())
    with open_weights(detected.path) as handle:
        metadata = dict(handle.metadata() or {})
        source = {key: (handle.get_slice(key).get_dtype(), handle.get_slice(key).get_shape()) for key in handle.keys()}
    specs = _output_specs(detected, source, native_plan, keep, out_dtype)
    metadata.update({BAKED_KEY: json.dumps(record), **output_metadata(WRITTEN_BY)})
    entries = {name: (code, shape) for name, (code, shape, _) in specs.items()}
    with StreamingWriter(path, entries, metadata) as writer, open_weights(detected.path) as handle:
        for name, (code, _, native) in specs.items():
            if native is None:  # a scale written together with its weight, or the fp8 marker
                continue
            tensor, source_scale = _merged_tensor(handle, detected, native, native_plan, plan, source, code)
            if code == "F8_E4M3":
                stored, scale = to_fp8(tensor, source_scale)
                writer.write(name, stored)
                writer.write(name[: -len(".weight")] + ".scale_weight", scale)
            else:
                writer.write(name, tensor)
        if fp8.SCALED_MARKER in specs:
            import torch

            writer.write(fp8.SCALED_MARKER, torch.empty(0, dtype=torch.float8_e4m3fn))
    return len(specs)


def _output_specs(detected, source: dict, native_plan: dict, keep, out_dtype) -> dict:
    """``{output key: (safetensors dtype, shape, native key or None)}`` in write order (a weight written fp8 is
    followed by its scale; the ``scaled_fp8`` marker comes last)."""
    import torch

    prefix, specs, any_fp8 = detected.prefix, {}, False
    for native, parts in native_plan.items():
        key = prefix + native
        if key not in source:
            continue
        stored, shape = source[key]
        if stored not in ("BF16", "F16", "F32", "F64", "F8_E4M3"):
            specs[key] = (stored, shape, native)
        elif any(keeps_fp32(part, keep) for part in parts):
            specs[key] = ("F32", shape, native)
        elif out_dtype == torch.float8_e4m3fn and _quantized(native, stored, shape):
            specs[key] = ("F8_E4M3", shape, native)
            specs[key[: -len(".weight")] + ".scale_weight"] = ("F32", [], None)
            any_fp8 = True
        else:
            specs[key] = (dtype_code(torch.bfloat16 if out_dtype == torch.float8_e4m3fn else out_dtype), shape, native)
    if any_fp8:
        specs[fp8.SCALED_MARKER] = ("F8_E4M3", [0], None)
    return specs


def _quantized(native: str, stored: str, shape) -> bool:
    """Which weights an fp8 output stores in fp8: those the source stored fp8, or (a bf16/fp32 source) the 2-D
    weights inside the repeated blocks, the tensors the published fp8 files quantize."""
    if stored == "F8_E4M3":
        return True
    return native.endswith(".weight") and len(shape) == 2 and bool(_BLOCK_INDEX.search("." + native))


def _merged_tensor(handle, detected, native: str, native_plan: dict, plan: dict, source: dict, code: str):
    """One native tensor, every diffusers part in ``plan`` fused (float32 sum, rounded once), in the dtype its
    output ``code`` says (float32 when it is about to be quantized to fp8)."""
    import torch


    key = detected.prefix + native
    value = handle.get_tensor(key)
    from_fp8, scale = value.dtype == torch.float8_e4m3fn, None
    if from_fp8:
        fp8.refuse_nan(value, detected.name, key)
        stem = key[: -len(".weight")]
        scale_key = next((stem + suffix for suffix in fp8.SCALE_SUFFIXES if stem + suffix in source), None)
        scale = (fp8.checked_scale(handle.get_tensor(scale_key), detected.name, scale_key) if scale_key
                 else torch.tensor(1.0))
        value = fp8.dequantize(value, scale, torch.float32)  # the weight's value, exactly
    if not value.is_floating_point():
        return value, None
    # an fp8 output is computed in float32 and quantized with its own scale by the caller
    target = {"F32": torch.float32, "F8_E4M3": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[code]
    layout = detected.kind.layout(detected.config)
    pieces = []
    for part_key, part in layout.split(native, value, native_plan[native]).items():
        # the loader casts a bf16/fp32 file's weight to its compute dtype before a fuse: so does the merge, so the
        # fused bits are the in-memory fuse's; an fp8 weight's float32 value is used as it is (rounded once)
        original = part if from_fp8 or code == "F8_E4M3" else part.to(target)
        if part_key in plan:
            fused = torch.empty(part.shape, dtype=target)
            write_patched(fused, original, plan[part_key])
            pieces.append(fused)
        else:
            pieces.append(original.to(target))
    return layout.join(native, pieces), scale


def to_fp8(value, source_scale):
    """(fp8 tensor, its ``scale_weight``) of a float32 fused value. The source's scale is kept when the value
    fits it (then the bytes are exactly what the in-memory fuse into that fp8 file holds, rounded to nearest);
    a value that would saturate at +-448 x that scale, or one from a bf16 source, gets its own scale, amax / 448
    (the published files' choice), instead of being clipped as an in-memory fuse into fixed storage must."""
    import torch

    if source_scale is not None and float(value.abs().max()) <= fp8.FP8_MAX * float(source_scale):
        return (value / source_scale).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(torch.float8_e4m3fn), \
            source_scale.to(torch.float32).reshape(())
    return fp8.quantize(value, scaled=True)
