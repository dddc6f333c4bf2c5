"""``lorabind merge --model DIR --lora FILE[:STRENGTH] [--lora ...] [--component NAME] --out DIR [--dtype ...]``.

Writes a complete diffusers folder with the LoRA(s) fused into one denoiser component. The fuse is the
engine's own (``loaders.binding``: exact float32 sum of every LoRA from the original weights, cast back once,
every key accounted for). Only the patched component is loaded — in float32, an exact upcast of any stored
dtype — not the whole pipeline: text encoders and VAE are copied byte for byte. The new folder is assembled
under a temporary name next to ``--out`` and renamed at the end; the source folder is never written.
Module-level imports stay light: ``lorabind --help`` must not import torch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

EXIT_REFUSED = 1
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="source diffusers model folder (read only)")
    parser.add_argument("--lora", required=True, action="append", metavar="FILE[:STRENGTH]",
                        help="LoRA file or PEFT folder, optionally with a strength (default 1.0); repeatable")
    parser.add_argument("--component", default="transformer", metavar="NAME",
                        help="denoiser component to fuse into (default: transformer; Wan2.2 low-noise: "
                             "transformer_2)")
    parser.add_argument("--out", required=True, metavar="DIR", help="new model folder to write (must not exist)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default=None,
                        help="dtype of the merged component's tensors (default: as stored in the source)")
    parser.add_argument("--lenient", action="store_true",
                        help="ignore LoRA keys that match nothing in the model (reported) instead of refusing")


def parse_lora_argument(value: str) -> tuple[str, float]:
    """``FILE[:STRENGTH]``: the last ``:`` part is a strength only when it parses as a number."""
    path, sep, tail = value.rpartition(":")
    if sep:
        try:
            return path, float(tail)
        except ValueError:
            pass
    return value, 1.0


def run(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ...loaders.errors import LoraBindError

    try:
        report = merge_to_folder(args.model, [parse_lora_argument(v) for v in args.lora], args.out,
                                 component=args.component, dtype=args.dtype, lenient=args.lenient)
    except (LoraBindError, FileExistsError) as exc:
        print(f"lorabind merge: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"lorabind merge: wrote {args.out}")
    print(json.dumps(report, indent=2))
    return 0


def merge_to_folder(model_dir: str, loras: list, out_dir: str, *, component: str = "transformer",
                    dtype: str | None = None, lenient: bool = False) -> dict:
    """Fuse ``loras`` [(path, strength)] into ``component`` of ``model_dir`` and write ``out_dir``."""
    from ...loaders.binding import bind
    from ...loaders.errors import ModelLoadError
    from ...loaders.handles import FuseSpec

    source = os.path.realpath(model_dir)
    target = os.path.abspath(out_dir)
    if os.path.exists(target):
        raise FileExistsError(f"--out {out_dir} already exists; choose a new folder")
    if target == source or target.startswith(source + os.sep):
        raise ModelLoadError(f"--out {out_dir} must not be inside the source folder {model_dir}")
    model = _load_component(source, component)
    fuses = [FuseSpec(os.path.realpath(path), strength, component, os.path.basename(path.rstrip("/\\")))
             for path, strength in loras]
    report = bind(model, fuses, [], lenient=lenient)

    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".lorabind-merge-", dir=parent)
    try:
        folder = os.path.join(staging, "model")
        shutil.copytree(source, folder)
        written = _rewrite_component(folder, component, model, dtype)
        os.replace(folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"model": os.path.basename(source), "component": component, "out": target,
            "tensors_rewritten": written, "patched_tensors": report.written, "fuses": report.fuses,
            "warnings": report.warnings}


def _load_component(folder: str, component: str):
    """A ``LoadedModel`` holding just ``component`` (float32), with the folder's family for key mapping."""
    import importlib

    from ...loaders.errors import ModelLoadError
    from ...loaders.model_store import LoadedModel, detect_family, read_model_index

    model_index = read_model_index(folder)
    entry = model_index.get(component)
    if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] and entry[1]):
        present = sorted(k for k, v in model_index.items() if isinstance(v, list) and v and v[0])
        raise ModelLoadError(f"{folder}: no component '{component}' in model_index.json (components: "
                             f"{', '.join(present)})")
    library, class_name = entry
    try:
        cls = getattr(importlib.import_module(library), class_name)
        module = cls.from_pretrained(folder, subfolder=component, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"{folder}: cannot load component '{component}' ({class_name}): {exc}") from exc
    module = module.float().eval().requires_grad_(False)
    return LoadedModel(path=folder, name=os.path.basename(folder), family=detect_family(model_index),
                       pipeline=None, components={component: module}, model_index=model_index)


def _rewrite_component(folder: str, component: str, model, dtype: str | None) -> int:
    """Rewrite every safetensors file of ``folder/component`` with the merged tensors (same keys and shards)."""
    import glob

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from ...loaders.errors import ModelLoadError

    state = model.components[component].state_dict()
    out_dtype = getattr(torch, _DTYPES[dtype]) if dtype else None
    patched = {pid.split(":", 1)[1] for pid in model.binding_state.patcher.patched}
    found, written = set(), 0
    for path in sorted(glob.glob(os.path.join(folder, component, "*.safetensors"))):
        tensors = {}
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata()
            for key in handle.keys():
                stored = handle.get_tensor(key)
                value = state.get(key, stored)
                if value.is_floating_point():
                    value = value.to(out_dtype or stored.dtype)
                tensors[key] = value.contiguous()
                found.add(key)
        save_file(tensors, path, metadata=metadata)
        written += len(tensors)
    lost = sorted(patched - found)
    if lost:
        raise ModelLoadError(f"{folder}/{component}: patched tensors not found in its weight files: {lost[:5]}")
    return written
