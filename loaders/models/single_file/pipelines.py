"""Single files as a model source (``SingleFileSet``): detect, check the set, load each component, assemble.

``model_store.load`` loads it by the same sequence as a diffusers folder, into the same shared object (one per
set of files, in the same cache, keyed by resolved paths, mtimes, dtype, fp8 rounding and placement), so
binding, sampling and every node downstream work on it unchanged. The family assembles its pipeline from the
loaded modules (``FamilySampling.load_pipeline`` with a ``PipelineSource`` of kind "single_file"); the
``model_index`` the model reports is what the equivalent diffusers folder would hold
(``interface.pipeline_index``: two experts -> ``transformer_2`` and the published ``boundary_ratio``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ... import fp8
from ...errors import ModelLoadError
from ...families import family_by_id
from ...families.interface import SOURCE_SINGLE_FILE, PipelineSource, pipeline_index
from ...io.file_identity import file_identity
from ...io.weight_sources import WeightSource
from ...placement.sizes import measure_module
from .. import compat
from ..sources import BuiltModel, ModelSource
from ..store import LoadedModel, load
from . import catalog
from .baked_files import baked_index_entry
from .detect import CheckpointSet, check_set, detect
from .gguf_loading import gguf_stored_bytes, load_gguf_component
from .loading import build_empty, fp8_parameters, fp32_modules, load_component, refuse_split


class SingleFileWeightSources:
    """Where each denoiser weight can be re-read for an exact restore (``loaders.io.weight_sources``): its native key
    in the file it came from. Fused/split tensors (none in the Wan/Qwen layouts) get no source and keep a RAM
    backup; the patcher checks every source bit for bit against the live weight before trusting it (an fp8
    weight re-reads as its exact bytes)."""

    def __init__(self, denoisers: dict):
        self.denoisers = denoisers  # component -> Detected

    def lookup(self, component: str, state_key: str):
        detected = self.denoisers.get(component)
        if detected is None or detected.is_gguf:  # no exact re-read from a GGUF file: the patcher keeps a backup
            return None
        layout = detected.kind.layout(detected.config)
        native = layout.to_native(state_key)
        if layout.fused_rule(native) is not None:
            return None
        return WeightSource(file=str(Path(detected.path).resolve()), key=detected.prefix + native)


def detect_set(denoisers: Sequence[tuple], vae: tuple, text_encoder: tuple,
               image_encoder: Optional[tuple] = None) -> CheckpointSet:
    """``(path, display name)`` pairs -> the checked set (``ModelLoadError`` naming the files that clash)."""
    return check_set([detect(p, n) for p, n in denoisers], detect(*vae), detect(*text_encoder),
                     detect(*image_encoder) if image_encoder is not None else None)


def _parts_index(named: dict) -> dict:
    """The ``model_index`` entries of the set's parts: what the family reads their roles from."""
    return {name: [d.kind.library, catalog.model_class(d.kind).__name__] for name, d in named.items()}


class SingleFileSet(ModelSource):
    """A checked set of single files (``detect_set``) as a ``ModelSource``; their tokenizer comes from the text
    encoder file or ``tokenizer_dirs``, and fuses into fp8 weights round with ``fp8_rounding``
    (``fp8.ROUNDINGS``)."""

    def __init__(self, files: CheckpointSet, *, tokenizer_dirs: Iterable[Path] = (), fp8_rounding: str = "nearest"):
        if fp8_rounding not in fp8.ROUNDINGS:
            raise ModelLoadError(f"fp8_rounding {fp8_rounding!r}: choose one of {list(fp8.ROUNDINGS)}")
        self.files, self.tokenizer_dirs, self.fp8_rounding = files, list(tokenizer_dirs), fp8_rounding
        self.family = family_by_id(files.family)
        self.paths = [d.path for d in files.files]
        self.path = files.denoisers[0].path
        self.name = self.label = " + ".join(os.path.basename(p) for p in self.paths)
        # component name -> Detected, named as the equivalent diffusers folder names them (the family decides)
        self.named = self.family.layout.single_file_parts(list(files.denoisers), files.vae, files.text_encoder,
                                                   files.image_encoder)

    def default_dtype(self):
        import torch

        return torch.bfloat16

    def cache_identity(self) -> tuple:
        return tuple(str(Path(p).resolve()) for p in self.paths), tuple(file_identity(p) for p in self.paths)

    def cache_options(self) -> tuple:
        return (self.fp8_rounding,)

    def check(self) -> None:
        # the versions the model family needs (two experts: the family's expert-pair id, Wan2.2 MoE)
        high = self.files.denoisers[0]
        model_family = self.family.model_families[-1 if len(self.files.denoisers) > 1 else 0]
        # an edition of equal shapes may need a newer library than the family (Qwen-Image-Edit-2511's zero_cond_t)
        compat.require(self.family.layout.requirements_id(model_family, variant=high.edition or high.model.variant),
                       high.title)

    def component_roles(self) -> dict:
        return self.family.layout.component_roles(_parts_index(self.named))

    def denoiser_heads(self) -> dict:
        return {name: detected.config["num_attention_heads"] for name, detected in self.named.items()
                if any(detected is d for d in self.files.denoisers)
                and isinstance(detected.config.get("num_attention_heads"), int)}

    def component_sizes(self, dtype) -> list:
        """Sized from the modules built on the meta device from the shipped configs and the files' headers (no
        weight is read; weights kept fp8 are sized at one byte, GGUF weights kept quantized at their bytes)."""
        roles = self.component_roles()
        sizes = []
        for name, detected in self.named.items():
            module = build_empty(detected)
            keep = fp32_modules(type(module), detected, dtype)
            stored = (gguf_stored_bytes(detected, module) if detected.is_gguf
                      else {key: module.get_parameter(key).numel() for key in fp8_parameters(detected, module)})
            sizes.append(measure_module(name, roles[name], module, dtype, keep, stored_bytes=stored,
                                        file_backed=not detected.is_gguf))
        return sizes

    def _load(self, component: str, detected, dtype, split):
        """One part's module; a denoiser under tensor parallelism (``split``) read as this rank's shard."""
        if split is None:
            return (load_gguf_component if detected.is_gguf else load_component)(
                detected, dtype=dtype, fp8_rounding=self.fp8_rounding)
        return load_component(detected, dtype=dtype, fp8_rounding=self.fp8_rounding,
                              start_split=lambda module: split.start(module, self.family, self.family.id, component))

    def build(self, dtype, split=None) -> BuiltModel:
        denoiser_names = self.family.layout.denoiser_components(_parts_index(self.named))
        for name in denoiser_names if split else ():  # before any file is loaded
            refuse_split(self.named[name])
        components = {component: self._load(component, detected, dtype, split if component in denoiser_names
                                            else None)
                      for component, detected in self.named.items()}
        encoder = self.files.text_encoder
        high = self.files.denoisers[0]
        source = PipelineSource(path=high.path, kind=SOURCE_SINGLE_FILE, dtype=dtype, components=components,
                                tokenizer=encoder.kind.tokenizer(encoder, self.tokenizer_dirs),
                                variant=high.model.variant, denoiser_files=tuple(self.files.denoisers))
        pipeline = self.family.sampling.load_pipeline(source)
        model_index = {**pipeline_index(pipeline), **baked_index_entry(self.files.denoisers)}
        denoisers = {n: components[n] for n in denoiser_names}
        return BuiltModel(pipeline=pipeline, model_family=self.family.layout.detect(model_index),
                          model_index=model_index, modules=components, roles=self.component_roles(), denoisers=denoisers,
                          weight_sources=SingleFileWeightSources(dict(zip(denoisers, self.files.denoisers))))


def load_single_files(files: CheckpointSet, *, tokenizer_dirs: Iterable[Path] = (), fp8_rounding: str = "nearest",
                      **options) -> LoadedModel:
    """The shared ``LoadedModel`` for a checked set of single files (see the module docstring): ``SingleFileSet``
    loaded by ``model_store.load``; ``options`` (dtype, default bfloat16; device, memory, attention, compile,
    on_progress, before_device_alloc) mean what they mean there, so a set loaded for another device or plan is
    its own cache entry."""
    return load(SingleFileSet(files, tokenizer_dirs=tokenizer_dirs, fp8_rounding=fp8_rounding), **options)


def files_sizes(files: tuple, dtype: str) -> list:
    """``memory.ComponentSize`` of the components of ComfyUI single files (denoisers, VAE, text/image encoders;
    any order; ``lorabind plan --files``) from their headers: the set is detected and checked as the loader checks
    it, fp8 weights sized at one byte."""
    detected = [detect(str(path), str(path)) for path in files]
    by_role = {role: [d for d in detected if d.role == role] for role in ("denoiser", "vae", "text_encoder",
                                                                            "image_encoder")}
    missing = [role for role in ("denoiser", "vae", "text_encoder") if not by_role[role]]
    if missing:
        raise ModelLoadError(f"--files names no {' and no '.join(missing)} file; a plan needs the denoiser(s), the VAE "
                             "and the text encoder")
    image_encoder = by_role["image_encoder"][0] if by_role["image_encoder"] else None
    checked = check_set(by_role["denoiser"], by_role["vae"][0], by_role["text_encoder"][0], image_encoder)
    import torch

    return SingleFileSet(checked).component_sizes(getattr(torch, dtype))
