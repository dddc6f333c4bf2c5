"""A ``LoadedModel`` from single files: detect, check the set, load each component, assemble the pipeline.

The result is the same shared object ``model_store.load_model`` gives for a diffusers folder (one per set of
files, in the same cache, keyed by resolved paths, mtimes, dtype and placement), so binding, sampling and every
node downstream work on it unchanged. The family assembles its pipeline from the loaded modules
(``ModelFamily.load_pipeline`` with a ``PipelineSource`` of kind "single_file"); the ``model_index`` the model
reports is what the equivalent diffusers folder would hold (``interface.pipeline_index``: two experts ->
``transformer_2`` and the published ``boundary_ratio``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .. import compat
from ..errors import ModelLoadError
from ..model_store import LoadedModel, load_shared, quiet_library_progress, resolve_dtype
from . import catalog, fp8, tokenizers
from .detect import CheckpointSet, Detected, check_set, detect
from .layouts import SPIECE_KEY
from .loading import build_empty, fp8_parameters, fp32_modules, load_component
from .merge import baked_index_entry

class SingleFileWeightSources:
    """Where each denoiser weight can be re-read for an exact restore (``loaders.weight_sources``): its native key
    in the file it came from. Fused/split tensors (none in the Wan/Qwen layouts) get no source and keep a RAM
    backup; the patcher checks every source bit for bit against the live weight before trusting it (an fp8
    weight re-reads as its exact bytes)."""

    def __init__(self, denoisers: dict):
        self.denoisers = denoisers  # component -> Detected

    def lookup(self, component: str, state_key: str):
        from ..weight_sources import WeightSource

        detected = self.denoisers.get(component)
        if detected is None:
            return None
        layout = detected.kind.layout(detected.config)
        native = layout.to_native(state_key)
        if layout.fused_rule(native) is not None:
            return None
        return WeightSource(file=str(Path(detected.path).resolve()), key=detected.prefix + native)


def _umt5_tokenizer(encoder: Detected, tokenizer_dirs):
    from safetensors import safe_open

    with safe_open(encoder.path, framework="pt") as handle:
        if SPIECE_KEY not in handle.keys():
            raise ModelLoadError(f"{encoder.name}: no '{SPIECE_KEY}' tensor (ComfyUI's umt5 files carry their "
                                 "SentencePiece tokenizer there); this file has none")
        model_bytes = tokenizers.spiece_bytes(handle.get_tensor(SPIECE_KEY))
    return tokenizers.umt5_tokenizer_from_spiece(model_bytes, encoder.name)


def _qwen_tokenizer(encoder: Detected, tokenizer_dirs):
    return tokenizers.qwen25_tokenizer([*tokenizer_dirs, tokenizers.comfy_qwen25_tokenizer_dir()], encoder.name)


_TOKENIZER = {"umt5": _umt5_tokenizer, "qwen25_vl": _qwen_tokenizer}


def detect_set(denoisers: Sequence[tuple], vae: tuple, text_encoder: tuple,
               image_encoder: Optional[tuple] = None) -> CheckpointSet:
    """``(path, display name)`` pairs -> the checked set (``ModelLoadError`` naming the files that clash)."""
    return check_set([detect(p, n) for p, n in denoisers], detect(*vae), detect(*text_encoder),
                     detect(*image_encoder) if image_encoder is not None else None)


def _family(files: CheckpointSet):
    from ..families import family_by_id

    return family_by_id(files.family)


def _named_files(files: CheckpointSet) -> dict:
    """component name -> Detected, named as the equivalent diffusers folder names them (the family decides)."""
    return _family(files).single_file_parts(list(files.denoisers), files.vae, files.text_encoder,
                                            files.image_encoder)


def _parts_index(named: dict) -> dict:
    """The ``model_index`` entries of the set's parts: what the family reads their roles from."""
    return {name: [d.kind.library, catalog.model_class(d.kind).__name__] for name, d in named.items()}


def _roles(named: dict, family) -> dict:
    """{component: role} of the set's parts, as the family gives them for the equivalent ``model_index``."""
    return family.component_roles(_parts_index(named))


def _choose_plan(files: CheckpointSet, *, label: str, device, memory: str, dtype):
    """The memory plan for the set, from the modules built on the meta device from the shipped configs and the
    files' headers (no weight is read; weights kept fp8 are sized at one byte). Refuses before loading."""
    from .. import load_plan

    if device.type == "cpu" and memory == "auto":
        return load_plan.cpu_plan(_roles(_named_files(files), _family(files)))
    return load_plan.plan_for_sizes(component_sizes(files, dtype), label=label, device=device, memory=memory)


def component_sizes(files: CheckpointSet, dtype) -> list:
    """``memory.sizes.ComponentSize`` of each file of the set as ``load_component`` will hold it at ``dtype``."""
    from ..memory.sizes import measure_module

    named = _named_files(files)
    roles = _roles(named, _family(files))
    sizes = []
    for name, detected in named.items():
        module = build_empty(detected)
        if hasattr(module, "tie_weights"):  # transformers 5 ties shared embeddings (umt5) at load, not when built
            module.tie_weights()
        keep = fp32_modules(type(module), detected, dtype)
        sizes.append(measure_module(name, roles[name], module, dtype, keep,
                                    one_byte=fp8_parameters(detected, module)))
    return sizes


def load_single_files(files: CheckpointSet, *, dtype=None, tokenizer_dirs: Iterable[Path] = (),
                      fp8_rounding: str = "nearest", device=None, memory=None, attention: str = "native",
                      compile: bool = False, before_device_alloc=None) -> LoadedModel:
    """The shared ``LoadedModel`` for a checked set of single files (see the module docstring); fp8 weights
    are fused into with ``fp8_rounding`` (``fp8.ROUNDINGS``). ``device``, ``memory``, ``attention``,
    ``compile`` and ``before_device_alloc`` mean what they mean for ``model_store.load_model`` (same session
    defaults, same planner and placement); a set loaded for another device or plan is its own cache entry."""
    import torch

    from .. import speed
    from ..devices import resolve_device, resolve_memory
    from ..families import family_by_id
    from ..families.interface import SOURCE_SINGLE_FILE, PipelineSource, pipeline_index
    from ..placement import ModelPlacement

    if fp8_rounding not in fp8.ROUNDINGS:
        raise ModelLoadError(f"fp8_rounding {fp8_rounding!r}: choose one of {list(fp8.ROUNDINGS)}")
    torch_dtype = resolve_dtype(dtype) or torch.bfloat16
    torch_device = resolve_device(device)
    memory_name = resolve_memory(memory)
    paths = [d.path for d in files.files]
    key = (tuple(str(Path(p).resolve()) for p in paths), tuple(os.stat(p).st_mtime_ns for p in paths),
           str(torch_dtype), fp8_rounding, str(torch_device), memory_name, attention, bool(compile))
    family_object = family_by_id(files.family)
    high = files.denoisers[0]

    def load() -> LoadedModel:
        # the versions the model family needs (two experts: the family's expert-pair id, Wan2.2 MoE)
        model_family = family_object.model_families[-1 if len(files.denoisers) > 1 else 0]
        compat.require(family_object.requirements_id(model_family, variant=high.model.variant), high.title)
        speed.check_attention(attention, torch_device)
        name = " + ".join(os.path.basename(p) for p in paths)
        plan = _choose_plan(files, label=name, device=torch_device, memory=memory_name, dtype=torch_dtype)
        if before_device_alloc is not None and torch_device.type != "cpu":
            before_device_alloc(plan.peak_device_bytes, torch_device)
        named = _named_files(files)
        components = {component: load_component(detected, dtype=torch_dtype, fp8_rounding=fp8_rounding)
                      for component, detected in named.items()}
        tokenizer = _TOKENIZER[files.text_encoder.kind.kind](files.text_encoder, list(tokenizer_dirs))
        source = PipelineSource(path=high.path, kind=SOURCE_SINGLE_FILE, dtype=torch_dtype, components=components,
                                tokenizer=tokenizer, variant=high.model.variant)
        with quiet_library_progress():
            pipeline = family_object.load_pipeline(source)
        pipeline.set_progress_bar_config(disable=True)
        model_index = {**pipeline_index(pipeline), **baked_index_entry(files.denoisers)}
        roles = _roles(named, family_object)
        denoisers = {n: components[n] for n in family_object.denoiser_components(_parts_index(named))}
        placed = ModelPlacement(components, plan, torch_device, roles)
        placed.apply()
        speed.apply_speed_options(denoisers, attention=attention, compile=compile)
        return LoadedModel(path=high.path, name=name, family=family_object.detect(model_index), pipeline=pipeline,
                           components=denoisers, model_index=model_index, placement=placed,
                           weight_sources=SingleFileWeightSources(dict(zip(denoisers, files.denoisers))))

    return load_shared(key, load)


