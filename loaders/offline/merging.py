"""Merge LoRAs into a copy of a diffusers folder without loading the model (``lorabind merge``).

The arithmetic is the engine's own (``loaders.binding.patching``: the exact float32 sum of every LoRA on the stored
weight, cast back once, every key accounted for by ``prepare_lora``), but the model is never loaded: the
component is built on the ``meta`` device for the key accounting and its weight files are streamed one shard at a
time, so a 14B expert merges in about one shard of memory (loading it and keeping the patcher's restore backups
would hold the model several times). Text encoders, VAE and every other file are copied byte for byte. The new
folder is written by ``safe_output``'s rule (assembled beside ``out_dir``, renamed at the end, never inside an
input); the source folder is never written.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from dataclasses import dataclass, field

from .. import families
from ..binding.fused_rows import NonFiniteResultError, write_patched
from ..binding.patching import PatchLayer, plan_state_keys
from ..contracts.baked import INDEX_KEY, contract_to_json, file_sha256
from ..dispatch.contract_discovery import discover_contract
from ..errors import ModelLoadError
from ..io import json_limits
from ..io.model_index import is_set, read_model_index
from ..io.safe_output import MARKER_FILE, check_output, safe_output
from ..lora.preparation import prepare_lora
from ..meta_modules import build_on_meta, component_class
from ..models.single_file.baked_files import WRITTEN_BY
from ..models.store import denoiser_names, detect_family


@dataclass
class MetaModel:
    """The part of a LoadedModel that ``prepare_lora`` reads, for a component built on the meta device."""

    name: str
    family: str
    components: dict = field(default_factory=dict)


ASSET_MODES = ("copy", "symlink", "hardlink")


def merge_into_folder(model_dir: str, loras: list, out_dir: str, *, component: str | None = None,
                      dtype=None, lenient: bool = False, asset_mode: str = "copy", overwrite: bool = False) -> dict:
    """Fuse ``loras`` into ``model_dir``'s denoisers and write ``out_dir``.

    ``loras``: ``(path, strength)`` (into ``component``; None: the model's main denoiser) or ``(component, path,
    strength)`` (a None component likewise), so both Wan2.2 experts are baked in one run. The model's family
    refuses files whose names say another slot (``FamilyLayout.check_slots``). ``dtype`` (a torch dtype, None =
    as stored) is the merged components' tensor type. Untouched files are copied, symlinked or hardlinked (``asset_mode``). The fused LoRAs' contracts and
    what was fused are written into the output ``model_index.json`` (``baked_contracts``). Returns the JSON-able
    report. ``out_dir`` follows ``safe_output``'s rule (``OutputRefusedError`` for an existing folder that is not
    an earlier output, or one without ``overwrite``, a path inside the source or a LoRA, a device...). Raises
    ``LoraBindError`` subclasses naming the file/key before anything is written; an error while writing leaves
    ``out_dir`` as it was.
    """
    if asset_mode not in ASSET_MODES:
        raise ValueError(f"asset mode must be one of {ASSET_MODES}, got {asset_mode!r}")
    source = os.path.realpath(model_dir)
    model_index = read_model_index(source)
    family = detect_family(model_index)
    requests = placed_requests(model_index, family, denoiser_names(model_index)[0], loras, component)
    output = dict(kind="folder", overwrite=overwrite, inputs=[model_dir, *(path for _, path, _ in requests)])
    target = check_output(out_dir, **output)
    model = MetaModel(name=os.path.basename(source), family=family, components={
        comp: component_structure(source, comp, model_index) for comp in dict.fromkeys(c for c, _, _ in requests)})
    layers, fuses, warnings, placed_contracts = prepare_layers(model, requests, lenient=lenient)
    contracts = [contract for _, contract in placed_contracts]
    plans = {comp: plan_state_keys(comp, model.components[comp], comp_layers)  # every shape checked first
             for comp, comp_layers in layers.items()}

    # a temporary folder beside out_dir, renamed at the end
    with safe_output(out_dir, written_by=WRITTEN_BY, **output) as folder:
        rewritten = {os.path.realpath(os.path.join(source, comp)) for comp in plans}
        linked = _place_assets(source, folder, rewritten, asset_mode)
        written = sum(_write_component(source, folder, comp, plan, dtype) for comp, plan in plans.items())
        model_index[INDEX_KEY] = baked_record(fuses, contracts)
        with open(os.path.join(folder, "model_index.json"), "w", encoding="utf-8") as handle:
            json.dump(model_index, handle, indent=2)
    return {"model": os.path.basename(source), "components": sorted(plans), "out": target,
            # every tensor of the merged components is written anew; the LoRAs change `tensors_fused` of them
            "tensors_fused": sum(len(p) for p in plans.values()),
            "tensors_copied_unchanged": written - sum(len(p) for p in plans.values()),
            "asset_mode": asset_mode, "files_linked": linked,
            "contracts": [c.describe() for c in contracts], "fuses": fuses, "warnings": warnings}


def placed_requests(model_index: dict, family: str, main: str, loras: list, component) -> list:
    """``(component, path, strength)`` of each LoRA: ``(path, strength)``, ``(component, path, strength)`` or
    ``(component, path, strength, slot name)`` (a missing component: ``component``, else ``main``), the
    family's slot check passed (a file whose name says another expert is refused, naming it). ``model_index``
    needs only the denoiser entries (a single-file merge passes its parts)."""
    family_object = families.family_by_id(family)
    requests = [(item[0] or _slot(family_object, model_index, item, main), item[1], float(item[2]))
                if len(item) >= 3 else (component or main, item[0], float(item[1])) for item in loras]
    family_object.layout.check_slots(
        model_index, [(comp, os.path.basename(str(path).rstrip("/\\")), "") for comp, path, _ in requests])
    return requests


def _slot(family, model_index: dict, item: tuple, main: str) -> str:
    """A LoRA given without a component: ``main``, or the component a slot name says (LightX2V's config names
    each expert's LoRA ``high_noise_model`` / ``low_noise_model``: the family reads it like a file name)."""
    if len(item) == 4 and item[3]:
        return family.layout.component_for_file(model_index, str(item[3]), strict=True)
    return main


def prepare_layers(model, requests: list, *, lenient: bool) -> tuple:
    """Every LoRA read, mapped and accounted against ``model`` (a ``MetaModel``) before anything is written:
    ``({component: [PatchLayer]}, fuse reports, warnings, [(component, contract)])``. Shared by the folder and
    the single-file merge, so both account keys and discover contracts the same way."""
    keymap = families.family_by_id(model.family)
    layers: dict = {comp: [] for comp in model.components}
    fuses, warnings, contracts = [], [], []
    for comp, path, strength in requests:
        prepared = prepare_lora(path, model, comp, keymap, guess_family=families.guess_family, lenient=lenient,
                                where="lorabind merge")
        layers[comp].append(PatchLayer(key=os.path.realpath(path), component=comp, strength=strength,
                                       targets=prepared.targets, name=prepared.name))
        fuses.append({"name": prepared.name, "component": comp, "strength": strength,
                      "sha256": file_sha256(path), "accounting": prepared.accounting.to_dict()})
        warnings.extend(prepared.accounting.warnings)
        contract = discover_contract(path, prepared.name, family=keymap, lora=prepared.lora, strength=strength)
        if contract is not None:
            contracts.append((comp, contract))
    return layers, fuses, warnings, contracts


def baked_record(fuses: list, contracts: list) -> dict:
    """What a merged model carries about its fuses (``baked_contracts``: no local paths): under ``_lorabind``
    in a folder's ``model_index.json``, as JSON text under the same key in a single file's metadata."""
    return {"merged_by": WRITTEN_BY,
            "fused": [{k: f[k] for k in ("name", "component", "strength", "sha256")} for f in fuses],
            "contracts": [contract_to_json(c) for c in contracts]}


def _place_assets(source: str, folder: str, rewritten: set, asset_mode: str) -> int:
    """Every file of ``source`` except the rewritten components' weights and ``model_index.json``, copied or
    linked into ``folder``; returns how many were linked."""
    linked = 0
    for where, _, names in os.walk(source):
        relative = os.path.relpath(where, source)
        os.makedirs(os.path.join(folder, relative), exist_ok=True)
        for name in names:
            src = os.path.join(where, name)
            if (os.path.realpath(where) in rewritten and name.endswith(".safetensors")) or \
                    (relative == "." and name in ("model_index.json", MARKER_FILE)):
                continue
            dst = os.path.join(folder, relative, name)
            if asset_mode == "symlink":
                os.symlink(os.path.realpath(src), dst)
            elif asset_mode == "hardlink":
                os.link(os.path.realpath(src), dst)
            else:
                shutil.copy2(src, dst)
                continue
            linked += 1
    return linked


def component_structure(folder: str, component: str, model_index: dict):
    """The component's module tree on the ``meta`` device: names and shapes for the key accounting, no weights
    (the weights are streamed from the files one shard at a time by ``_write_component``)."""
    entry = model_index.get(component)
    if not is_set(entry):
        present = sorted(k for k, v in model_index.items() if is_set(v))
        raise ModelLoadError(f"{folder}: no component '{component}' in model_index.json (components: "
                             f"{', '.join(present)})")
    library, class_name = entry
    try:
        cls = component_class(library, class_name)
        return build_on_meta(cls, cls.load_config(folder, subfolder=component, local_files_only=True))
    except Exception as exc:
        raise ModelLoadError(f"{folder}: cannot build component '{component}' ({class_name}): {exc}") from exc


def _write_component(source: str, folder: str, component: str, plan: dict, out_dtype) -> int:
    """Write ``folder/component``'s safetensors files (same names, keys and shards as the source's) with every
    planned tensor fused: float32 from the stored value, cast once to the stored (or ``out_dtype``) type. Peak
    memory is one shard plus one layer's float32 temporary, never the whole model."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file


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
            index = json_limits.load_file(index_path)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{index_path}: cannot be read ({exc})") from None
        if not isinstance(index, dict):
            continue
        if isinstance(index.get("metadata"), dict) and "total_size" in index["metadata"]:
            index["metadata"]["total_size"] = total_bytes
            with open(index_path, "w", encoding="utf-8") as handle:
                json.dump(index, handle, indent=2)
