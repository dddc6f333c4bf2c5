"""A ``LoadedModel`` from single files: detect, check the set, load each component, assemble the pipeline.

The result is the same shared object ``model_store.load_model`` gives for a diffusers folder (one per set of
files, cached by resolved paths, mtimes and dtype), so binding, sampling and every node downstream work on it
unchanged. The pipeline per family is assembled from a table (``_ASSEMBLE``); the ``model_index`` it reports
is what the equivalent diffusers folder would hold (two experts -> ``transformer_2`` and the published
``boundary_ratio``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterable, Sequence

from .. import compat
from ..errors import ModelLoadError
from ..model_store import LoadedModel, quiet_library_progress, resolve_dtype
from . import catalog, fp8, tokenizers
from .detect import CheckpointSet, Detected, check_set, detect
from .layouts import SPIECE_KEY
from .loading import build_empty, fp32_modules, load_component

# Wan2.2 A14B boundary_ratio as published (Wan-AI/Wan2.2-{T2V,I2V}-A14B-Diffusers model_index.json)
_BOUNDARY = {"t2v": 0.875, "i2v": 0.9}

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


_cache: dict[tuple, LoadedModel] = {}
_lock = threading.Lock()


def _wan_pipeline(files: CheckpointSet, components: dict, tokenizer):
    from diffusers import UniPCMultistepScheduler, WanPipeline

    high = files.denoisers[0]
    index = {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
             "transformer_2": [None, None], "expand_timesteps": high.model.variant == "ti2v"}
    extra = {}
    if "transformer_2" in components:
        index["transformer_2"] = ["diffusers", "WanTransformer3DModel"]
        index["boundary_ratio"] = _BOUNDARY[high.model.variant]
        extra = {"transformer_2": components["transformer_2"], "boundary_ratio": index["boundary_ratio"]}
    if index["expand_timesteps"]:
        extra["expand_timesteps"] = True
    # the scheduler the Wan-AI diffusers folders ship; lorabind's sampler drives its own sigmas
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0,
                                        num_train_timesteps=1000)
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=components["text_encoder"], vae=components["vae"],
                           scheduler=scheduler, transformer=components["transformer"], **extra)
    return pipeline, index, "wan2.2_moe" if "transformer_2" in components else "wan2.1"


def _qwen_image_pipeline(files: CheckpointSet, components: dict, tokenizer):
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    index = {"_class_name": "QwenImagePipeline", "transformer": ["diffusers", "QwenImageTransformer2DModel"]}
    pipeline = QwenImagePipeline(transformer=components["transformer"], vae=components["vae"],
                                 scheduler=FlowMatchEulerDiscreteScheduler(),
                                 text_encoder=components["text_encoder"], tokenizer=tokenizer)
    return pipeline, index, "qwen_image"


_ASSEMBLE = {"wan": _wan_pipeline, "qwen_image": _qwen_image_pipeline}
# the LoadedModel.family id: [one denoiser, two experts] per single-file family
_FAMILY_IDS = {False: {"wan": "wan2.1", "qwen_image": "qwen_image"}, True: {"wan": "wan2.2_moe"}}


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


def detect_set(denoisers: Sequence[tuple], vae: tuple, text_encoder: tuple) -> CheckpointSet:
    """``(path, display name)`` pairs -> the checked set (``ModelLoadError`` naming the files that clash)."""
    return check_set([detect(p, n) for p, n in denoisers], detect(*vae), detect(*text_encoder))


def _named_files(files: CheckpointSet) -> dict:
    """component name -> Detected, named as the equivalent diffusers folder names them."""
    named = dict(zip(("transformer", "transformer_2"), files.denoisers))
    return {**named, "vae": files.vae, "text_encoder": files.text_encoder}


def _placement_index(named: dict) -> dict:
    """A ``model_index``-shaped dict of the weighted components, for the planner's and placement's roles."""
    return {name: [d.kind.library, catalog.model_class(d.kind).__name__] for name, d in named.items()}


def _choose_plan(files: CheckpointSet, *, label: str, device, memory: str, dtype):
    """The memory plan for the set, from the modules built on the meta device from the shipped configs (no
    weight is read; fp8 weights are sized at the compute dtype, an upper bound). Refuses before loading."""
    from .. import load_plan
    from ..memory.sizes import component_role, measure_module

    named = _named_files(files)
    index = _placement_index(named)
    if device.type == "cpu" and memory == "auto":
        return load_plan.cpu_plan(index)
    sizes = []
    for name, detected in named.items():
        module = build_empty(detected)
        keep = fp32_modules(type(module), detected, dtype)
        sizes.append(measure_module(name, component_role(name, index), module, dtype, keep))
    return load_plan.plan_for_sizes(sizes, label=label, device=device, memory=memory)


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
    from ..placement import ModelPlacement

    if fp8_rounding not in fp8.ROUNDINGS:
        raise ModelLoadError(f"fp8_rounding {fp8_rounding!r}: choose one of {list(fp8.ROUNDINGS)}")
    torch_dtype = resolve_dtype(dtype) or torch.bfloat16
    torch_device = resolve_device(device)
    memory_name = resolve_memory(memory)
    paths = [d.path for d in files.denoisers] + [files.vae.path, files.text_encoder.path]
    key = (tuple(str(Path(p).resolve()) for p in paths), tuple(os.stat(p).st_mtime_ns for p in paths),
           str(torch_dtype), fp8_rounding, str(torch_device), memory_name, attention, bool(compile))
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            if cached.placement is not None:
                cached.placement.ensure_placed()
            return cached
        compat.require(_FAMILY_IDS[len(files.denoisers) > 1][files.family], files.denoisers[0].title)
        speed.check_attention(attention, torch_device)
        name = " + ".join(os.path.basename(p) for p in paths)
        plan = _choose_plan(files, label=name, device=torch_device, memory=memory_name, dtype=torch_dtype)
        if before_device_alloc is not None and torch_device.type != "cpu":
            before_device_alloc(plan.peak_device_bytes, torch_device)
        components = {name: load_component(d, dtype=torch_dtype, fp8_rounding=fp8_rounding)
                      for name, d in zip(("transformer", "transformer_2"), files.denoisers)}
        components["vae"] = load_component(files.vae, dtype=torch_dtype)
        components["text_encoder"] = load_component(files.text_encoder, dtype=torch_dtype)
        tokenizer = _TOKENIZER[files.text_encoder.kind.kind](files.text_encoder, list(tokenizer_dirs))
        with quiet_library_progress():
            pipeline, model_index, family = _ASSEMBLE[files.family](files, components, tokenizer)
        pipeline.set_progress_bar_config(disable=True)
        denoisers_loaded = {n: components[n] for n in ("transformer", "transformer_2") if n in components}
        for module in components.values():
            module.eval().requires_grad_(False)
        placed = ModelPlacement(components, plan, torch_device, _placement_index(_named_files(files)))
        placed.apply()
        speed.apply_speed_options(denoisers_loaded, attention=attention, compile=compile)
        model = LoadedModel(path=files.denoisers[0].path, name=name, family=family, pipeline=pipeline,
                            components=denoisers_loaded, model_index=model_index, placement=placed,
                            weight_sources=SingleFileWeightSources(dict(zip(denoisers_loaded, files.denoisers))))
        for stale in [k for k in _cache if k[0] == key[0] and k[2:] == key[2:]]:
            stale_model = _cache.pop(stale)
            if stale_model.placement is not None:
                stale_model.placement.release()
        _cache[key] = model
        return model


def release_device_memory() -> None:
    """Give every loaded set's device memory back (ComfyUI's "unload models"); they return on their next use."""
    with _lock:
        models = list(_cache.values())
    for model in models:
        if model.placement is not None:
            model.placement.release()


def clear_cache() -> None:
    """Forget every loaded set, giving device memory back first."""
    with _lock:
        for model in _cache.values():
            if model.placement is not None:
                model.placement.release()
        _cache.clear()
