"""A diffusers component folder on its own (``transformer/``: ``config.json`` and its safetensors shards, no
``model_index.json``), as LightX2V's merger and extractor take one for ``--source-model``, merged into one file and
read by the extractor.

Why its own path: its keys are the diffusers module names, which the single-file detection (native names, by
marker keys) cannot place for every family, while its ``config.json`` names the diffusers class exactly; so the
class is built on the meta device from that config, the family is the one whose single-file kinds build that class,
and the merge is the folder merge's arithmetic (``merging``) streamed into one ``.safetensors`` file that keeps the
source's key names (what LightX2V's merger writes). The file says so in its metadata (``KEYS_KEY``), so the
extractor reads it back by those names.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from ..binding.fused_rows import write_patched
from ..binding.patching import plan_state_keys
from ..contracts.baked import INDEX_KEY
from ..errors import LoraBindError
from ..families import family_by_id
from ..io import json_limits
from ..io.safe_output import check_output, output_metadata, safe_output
from ..meta_modules import build_on_meta, component_class
from ..models.single_file import catalog
from ..models.single_file.baked_files import WRITTEN_BY
from ..models.single_file.detect import read_metadata
from ..models.single_file.shard_folders import ShardedSafetensors, is_shard_folder, shard_paths
from ..models.single_file.writer import StreamingWriter, dtype_code
from .extraction import ComponentWeights
from .merging import MetaModel, baked_record, placed_requests, prepare_layers

KEYS_KEY = "lorabind_keys"  # metadata of a merged file whose keys are a diffusers component's
DIFFUSERS_KEYS = "diffusers"
CLASS_KEY = "lorabind_class"  # and the diffusers class they are the keys of


def component_class_of(folder: str):
    """The diffusers model class a standalone component folder's ``config.json`` names, or None (no config, no
    class name, or a class the installed diffusers does not have: a native release's own ``WanModel``)."""
    if not is_shard_folder(folder):
        return None
    try:
        config = json_limits.load_file(os.path.join(folder, "config.json"))
        return component_class("diffusers", str(config["_class_name"]))
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
        return None


def _family_of(cls, folder: str) -> tuple[str, str]:
    """(model family id, component name) of a lone denoiser of ``cls``: the family whose single-file denoiser
    kinds build ``cls``, and its main denoiser, as it names a lone single file (LoraBindError naming the folder)."""
    for kind in catalog.kinds().values():
        if kind.role == "denoiser" and catalog.model_class(kind) is cls:
            family = family_by_id(kind.family)
            return family.model_families[0], family.layout.lora_components[0]
    raise LoraBindError(f"{folder}: its config.json names {cls.__name__}, which no model family lorabind merges "
                        "uses for a denoiser")


def merge_component_folder(folder: str, loras: list, out: str, *, component: Optional[str] = None, dtype=None,
                           lenient: bool = False, overwrite: bool = False) -> dict:
    """Fuse ``loras`` into the component folder's weights and write them, every key as the source names it, into
    the one ``.safetensors`` file ``out``; everything is checked before a byte is written."""
    name = os.path.basename(os.path.normpath(folder))
    if not str(out).endswith(".safetensors"):
        raise LoraBindError(f"--out {out}: a component folder ({name}) merges into one .safetensors file, as "
                            "LightX2V's merger writes it")
    cls = component_class_of(folder)
    module = build_on_meta(cls, cls.load_config(folder, local_files_only=True))
    model_family, main = _family_of(cls, folder)
    requests = placed_requests({main: ["diffusers", cls.__name__]}, model_family, main, loras, component)
    inputs = [folder, *(path for _, path, _ in requests)]
    check_output(out, kind="file", inputs=inputs, overwrite=overwrite)
    model = MetaModel(name=name, family=model_family, components={main: module})
    layers, fuses, warnings, contracts = prepare_layers(model, requests, lenient=lenient)
    plan = plan_state_keys(main, module, layers[main])
    metadata = {INDEX_KEY: json.dumps(baked_record(fuses, [c for _, c in contracts])), KEYS_KEY: DIFFUSERS_KEYS,
                CLASS_KEY: cls.__name__, **output_metadata(WRITTEN_BY)}
    with safe_output(out, written_by=WRITTEN_BY, kind="file", inputs=inputs, overwrite=overwrite) as staged:
        written = _write_merged(ShardedSafetensors(folder, name), plan, staged, dtype, metadata)
    return {"model": name, "out": os.path.abspath(out), "components": {main: os.path.basename(out)},
            "tensors_fused": len(plan), "tensors_written": {main: written},
            "contracts": [c.describe() for _, c in contracts], "fuses": fuses, "warnings": warnings}


def _write_merged(handle, plan: dict, path: str, out_dtype, metadata: dict) -> int:
    """Stream every tensor of ``handle`` into ``path``, the planned ones fused (the exact float32 sum, rounded once
    to the stored or ``out_dtype`` type), one tensor in memory at a time."""
    import torch

    def stored(key):
        sliced = handle.get_slice(key)
        return sliced.get_dtype(), sliced.get_shape()

    floats = ("BF16", "F16", "F32", "F64")
    keys = handle.keys()
    entries = {}
    for key in keys:
        code, shape = stored(key)
        entries[key] = (dtype_code(out_dtype) if out_dtype is not None and code in floats else code, shape)
    with StreamingWriter(path, entries, metadata) as writer:
        for key in keys:
            value = handle.get_tensor(key)
            target = out_dtype if out_dtype is not None and value.is_floating_point() else value.dtype
            if key in plan:
                fused = torch.empty(value.shape, dtype=target)
                write_patched(fused, value, plan[key])
                value = fused
            writer.write(key, value.to(target))
    return len(entries)


def diffusers_named_weights(path: str) -> Optional[ComponentWeights]:
    """The extractor's reader of a standalone component folder, or of a file ``merge_component_folder`` wrote,
    by the diffusers names they hold (None for anything else: a single file or a native shard folder, read
    through its layout)."""
    folder, name = os.path.split(os.path.normpath(path))
    if os.path.isdir(path):
        cls = component_class_of(path)
        files = shard_paths(path, name) if cls is not None else None
    else:
        metadata = read_metadata(path, name)
        cls = _merged_class(metadata)
        files = [path] if metadata.get(KEYS_KEY) == DIFFUSERS_KEYS and cls is not None else None
    if files is None:
        return None
    weights = ComponentWeights(folder, name, files=files)
    weights.component = _family_of(cls, path)[1]
    return weights


def _merged_class(metadata: dict):
    """The diffusers class a file ``merge_component_folder`` wrote was merged from (``CLASS_KEY``), or None."""
    try:
        return component_class("diffusers", str(metadata[CLASS_KEY]))
    except (KeyError, ImportError, AttributeError):
        return None
