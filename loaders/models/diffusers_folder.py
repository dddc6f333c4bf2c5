"""A diffusers folder (``model_index.json`` + one subfolder per component) as a ``ModelSource``.

Its family loads the pipeline (``FamilySampling.load_pipeline``: ``DiffusionPipeline`` for Wan and Qwen-Image, a
modular pipeline for MiniMax-H3), offline only, safetensors only; a sharded component's files are read by
``$LORABIND_LOAD_WORKERS`` threads (``parallel_loading``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError
from ..families import detect_model_family, family_by_id
from ..families.interface import PipelineSource
from ..io import json_limits
from ..io.file_identity import model_folder_identity
from ..io.model_index import read_model_index
from ..io.regular_files import check_model_folder
from ..lora.reader import PICKLE_SUFFIXES
from ..placement import component_sizes
from ..placement.load_plan import stored_dtype, stored_dtypes
from . import compat
from .parallel_loading import auto_workers, shard_loading, threads_can_load
from .sources import BuiltModel, ModelSource
from .split_loading import load_split_denoiser

LOAD_WORKERS_VARIABLE = "LORABIND_LOAD_WORKERS"


def default_load_workers(folder) -> int:
    """Threads for a sharded folder's weight files: ``$LORABIND_LOAD_WORKERS`` when set to a number, else
    ``parallel_loading.auto_workers`` (1 on a rotating disk, else one per usable core, at most 8)."""
    value = os.environ.get(LOAD_WORKERS_VARIABLE, "").strip()
    if value in ("", "auto"):
        return auto_workers(folder)
    try:
        return max(1, int(value))
    except ValueError:
        raise ModelLoadError(f"{LOAD_WORKERS_VARIABLE}={value!r} is not a whole number of worker threads") from None


def require_libraries(model_index: dict, family: str, label: str, folder: Optional[Path] = None) -> None:
    """Refuse, naming the versions needed, when the installed libraries are older than a folder's model needs:
    its family's, or a later variant's (Wan2.2 TI2V is a one-transformer Wan pipeline that came with Wan2.2;
    Qwen-Image-Edit-2511 shows only in ``folder``'s transformer config)."""
    compat.require(family_by_id(family).layout.requirements_id(family, model_index=model_index, folder=folder), label)


def refuse_pickle_weights(folder: Path, model_index: dict) -> None:
    """A component whose weights exist only in a pickle format (``diffusion_pytorch_model.bin``...) is refused,
    naming the file: unpickling runs code. ``use_safetensors=True`` makes the libraries refuse it too, but
    with a message about a missing ``.safetensors`` file that does not say why."""
    for name in model_index:
        component = folder / name
        if name.startswith("_") or not component.is_dir():
            continue
        files = sorted(p.name for p in component.iterdir())
        pickled = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
        if pickled and not any(f.endswith(".safetensors") for f in files):
            raise ModelLoadError(
                f"{folder.name}/{name}/{pickled[0]}: pickle weights are not loaded (unpickling runs code); "
                "convert the component to .safetensors")


class DiffusersFolder(ModelSource):
    """``path``: the folder; ``name``: what the model is called (its name under the models root, which every
    message uses: an absolute path must not reach the browser); ``load_workers``
    (default ``default_load_workers(path)``) > 1 loads a sharded model's files in parallel (283 s -> 56 s for a
    64.5 GiB Wan2.2-I2V-A14B folder in vllm-omni's measurement)."""

    def __init__(self, path, *, name: str = "", load_workers: int | None = None):
        self.folder = Path(path).expanduser().resolve()
        self.model_index = read_model_index(self.folder)
        self.path, self.name, self.label = str(self.folder), name or self.folder.name, self.folder.name
        self.load_workers = load_workers
        self.model_family = detect_model_family(self.model_index)
        self.family = family_by_id(self.model_family)

    def cache_identity(self) -> tuple:
        """The folder, and the identity of every file in it and in its component folders: a file replaced or
        rewritten (even in place, with its size) is a new version, loaded afresh."""
        return str(self.folder), model_folder_identity(str(self.folder))

    def check(self) -> None:
        """Also, before diffusers and transformers open anything: no FIFO, device or socket in the folder or its
        components, no config or tokenizer file too large to read whole (they read those with plain ``open``)."""
        require_libraries(self.model_index, self.model_family, f"{self.name} ({self.model_family})", self.folder)
        try:
            check_model_folder(self.folder, [name for name in self.model_index if not name.startswith("_")])
        except OSError as exc:
            raise ModelLoadError(f"{self.name}: {exc}") from None
        refuse_pickle_weights(self.folder, self.model_index)

    def component_roles(self) -> dict:
        return self.family.layout.component_roles(self.model_index)

    def denoiser_heads(self) -> dict:
        heads = {}
        for name in self.family.layout.denoiser_components(self.model_index):
            try:
                config = json_limits.load_file(self.folder / name / "config.json")
            except (OSError, ValueError):
                continue  # the loader reports an unreadable config, naming it
            if isinstance(config, dict) and isinstance(config.get("num_attention_heads"), int):
                heads[name] = config["num_attention_heads"]
        return heads

    def component_sizes(self, dtype) -> list:
        dtype_name = str(dtype).replace("torch.", "") if dtype is not None else stored_dtype(self.folder,
                                                                                              self.model_index)
        return component_sizes(self.folder, dtype_name)

    def build(self, dtype, split=None) -> BuiltModel:
        workers = self.load_workers
        if workers is None:
            workers = default_load_workers(self.path) if threads_can_load() else 1
        # under tensor parallelism the denoisers are read split first, then the pipeline takes them as built
        prebuilt = {name: load_split_denoiser(self.folder, name, self.model_index, self.family, split, dtype,
                                              self.name, self.model_family)
                    for name in self.family.layout.denoiser_components(self.model_index)} if split else {}
        try:
            with shard_loading(workers):
                source = PipelineSource(path=self.path, model_index=self.model_index,
                                        dtype=dtype if dtype is not None else self._stored_dtypes(),
                                        components=prebuilt)
                pipeline = self.family.sampling.load_pipeline(source)
        except Exception as exc:
            raise ModelLoadError(f"{self.name}: cannot load the {self.model_family} pipeline: {exc}") from exc
        return BuiltModel(pipeline=pipeline, model_family=self.model_family, model_index=self.model_index,
                          modules=dict(pipeline.components), roles=self.component_roles(),
                          denoisers=self._denoisers(pipeline))

    def _stored_dtypes(self) -> dict:
        """``{component: torch dtype}`` each weighted component is stored in: what ``dtype=auto`` loads."""
        import torch

        return {name: getattr(torch, dtype) for name, dtype in stored_dtypes(self.folder, self.model_index).items()}

    def _denoisers(self, pipeline) -> dict:
        """{name: module} of the index's denoisers; one the installed diffusers dropped (an older release ignores
        an unknown component with only a warning) is refused by name."""
        listed = self.family.layout.denoiser_components(self.model_index)
        components = {n: getattr(pipeline, n) for n in listed if getattr(pipeline, n, None)}
        dropped = sorted(set(listed) - set(components))
        if dropped:
            raise ModelLoadError(f"{self.name}: model_index.json lists {dropped} but the installed diffusers did "
                                 f"not load them; {self.model_family} needs a newer diffusers")
        return components
