"""Merge LoRAs into a copy of a diffusers folder without loading the model (``lorabind merge``).

The arithmetic is the engine's own (``loaders.patching``: the exact float32 sum of every LoRA on the stored
weight, cast back once, every key accounted for by ``prepare_lora``), but the model is never loaded: the
component is built on the ``meta`` device for the key accounting and its weight files are streamed one shard at a
time, so a 14B expert merges in about one shard of memory (loading it and keeping the patcher's restore backups
would hold the model several times). Text encoders, VAE and every other file are copied byte for byte. The new
folder is assembled under a temporary name next to ``out_dir`` and renamed at the end; the source folder is never
written.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field

from . import json_limits
from .errors import ModelLoadError


@dataclass
class MetaModel:
    """The part of a LoadedModel that ``prepare_lora`` reads, for a component built on the meta device."""

    name: str
    family: str
    components: dict = field(default_factory=dict)


def merge_into_folder(model_dir: str, loras: list, out_dir: str, *, component: str = "transformer",
                      dtype=None, lenient: bool = False) -> dict:
    """Fuse ``loras`` [(path, strength)] into ``component`` of ``model_dir`` and write ``out_dir``.

    ``dtype`` (a torch dtype, None = as stored) is the merged component's tensor type. Returns the JSON-able
    report (fuses with their accounting, tensors rewritten, warnings). Raises ``FileExistsError`` when
    ``out_dir`` exists and ``LoraBindError`` subclasses naming the file/key before anything is written.
    """
    from .lora.preparation import prepare_lora
    from .model_store import detect_family, read_model_index
    from .patching import PatchLayer, plan_state_keys

    source = os.path.realpath(model_dir)
    target = os.path.abspath(out_dir)
    if os.path.exists(target):
        raise FileExistsError(f"--out {out_dir} already exists; choose a new folder")
    if target == source or target.startswith(source + os.sep):
        raise ModelLoadError(f"--out {out_dir} must not be inside the source folder {model_dir}")
    model_index = read_model_index(source)
    model = MetaModel(name=os.path.basename(source), family=detect_family(model_index),
                      components={component: component_structure(source, component, model_index)})
    layers, fuses, warnings = [], [], []
    for path, strength in loras:
        prepared = prepare_lora(path, model, component, lenient=lenient, where="lorabind merge")
        layers.append(PatchLayer(key=os.path.realpath(path), component=component, strength=float(strength),
                                 targets=prepared.targets, name=prepared.name))
        fuses.append({"name": prepared.name, "path": path, "component": component, "strength": float(strength),
                      "accounting": prepared.accounting.to_dict()})
        warnings.extend(prepared.accounting.warnings)
    plan = plan_state_keys(component, model.components[component], layers)  # every shape checked first

    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".lorabind-merge-", dir=parent)
    try:
        folder = os.path.join(staging, "model")
        weights = os.path.realpath(os.path.join(source, component))
        shutil.copytree(source, folder, ignore=lambda where, names: [
            n for n in names if os.path.realpath(where) == weights and n.endswith(".safetensors")])
        written = _write_component(source, folder, component, plan, dtype)
        os.replace(folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"model": os.path.basename(source), "component": component, "out": target,
            "tensors_rewritten": written, "patched_tensors": len(plan), "fuses": fuses, "warnings": warnings}


def component_structure(folder: str, component: str, model_index: dict):
    """The component's module tree on the ``meta`` device: names and shapes for the key accounting, no weights
    (the weights are streamed from the files one shard at a time by ``_write_component``)."""
    import torch

    entry = model_index.get(component)
    if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] and entry[1]):
        present = sorted(k for k, v in model_index.items() if isinstance(v, list) and v and v[0])
        raise ModelLoadError(f"{folder}: no component '{component}' in model_index.json (components: "
                             f"{', '.join(present)})")
    library, class_name = entry
    try:
        cls = getattr(importlib.import_module(library), class_name)
        config = cls.load_config(folder, subfolder=component, local_files_only=True)
        with torch.device("meta"):
            return cls.from_config(config).eval()
    except Exception as exc:
        raise ModelLoadError(f"{folder}: cannot build component '{component}' ({class_name}): {exc}") from exc


def _write_component(source: str, folder: str, component: str, plan: dict, out_dtype) -> int:
    """Write ``folder/component``'s safetensors files (same names, keys and shards as the source's) with every
    planned tensor fused: float32 from the stored value, cast once to the stored (or ``out_dtype``) type. Peak
    memory is one shard plus one layer's float32 temporary, never the whole model."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from .patching import NonFiniteResultError, write_patched

    found, written, total_bytes = set(), 0, 0
    files = sorted(glob.glob(os.path.join(source, component, "*.safetensors")))
    for path in files:
        tensors = {}
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata()
            for key in handle.keys():
                value = handle.get_tensor(key)
                stored_dtype = value.dtype
                if key in plan:
                    fused = torch.empty(value.shape, dtype=out_dtype or stored_dtype)
                    try:
                        write_patched(fused, value, plan[key])
                    except NonFiniteResultError as exc:  # nothing is moved into out_dir: the staging is removed
                        raise NonFiniteResultError(f"{component}:{key}: {exc}") from None
                    value = fused
                elif out_dtype is not None and value.is_floating_point():
                    value = value.to(out_dtype)
                tensors[key] = value.contiguous()
                total_bytes += value.numel() * value.element_size()
                found.add(key)
        save_file(tensors, os.path.join(folder, component, os.path.basename(path)), metadata=metadata)
        written += len(tensors)
        del tensors
    lost = sorted(set(plan) - found)
    if lost:
        raise ModelLoadError(f"{source}/{component}: patched tensors not found in its weight files: {lost[:5]}")
    _update_shard_index(os.path.join(folder, component), total_bytes)
    return written


def _update_shard_index(component_folder: str, total_bytes: int) -> None:
    """A sharded component's ``*.safetensors.index.json`` states the total size; a new dtype changes it."""
    for index_path in glob.glob(os.path.join(component_folder, "*.safetensors.index.json")):
        try:
            with open(index_path, encoding="utf-8") as handle:
                index = json_limits.load(handle)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{index_path}: cannot be read ({exc})") from None
        if not isinstance(index, dict):
            continue
        if isinstance(index.get("metadata"), dict) and "total_size" in index["metadata"]:
            index["metadata"]["total_size"] = total_bytes
            with open(index_path, "w", encoding="utf-8") as handle:
                json.dump(index, handle, indent=2)
