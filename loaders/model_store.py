"""Loaded diffusers models, shared by every handle that names them.

``LoadedModel`` is the one mutable object behind ``ModelHandle``s: the sampler binds it (via
``loaders.binding``) to the state a handle describes. ``binding_state`` belongs to the engine.

Why a cache: a graph (and the executor across prompts) may name one folder from several loader nodes; the
binding engine relies on there being exactly one pipeline per folder so that patches are never applied to a
copy. The cache key is the resolved path, the ``model_index.json`` mtime (a rebuilt folder reloads), the
dtype, the device, the memory plan requested and the speed options: a model placed for one device or plan is a
different pipeline from the same folder placed for another.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import compat
from .errors import ModelLoadError
from .model_index import read_model_index
from .parallel_loading import auto_workers, shard_loading


@dataclass(eq=False)
class LoadedModel:
    path: str  # resolved diffusers folder
    name: str  # name relative to the models root, for messages
    family: str  # "wan2.1", "wan2.2_moe", "qwen_image", "minimax_h3"
    pipeline: Any  # the diffusers pipeline object (components shared with ``components``)
    components: dict = field(default_factory=dict)  # denoiser name -> torch.nn.Module
    model_index: dict = field(default_factory=dict)
    binding_state: Any = None  # owned by loaders.binding (patcher backups, active adapters)
    placement: Any = None  # loaders.placement.ModelPlacement: where each component lives under its memory plan
    # where each weight can be re-read from (``lookup(component, key) -> WeightSource``); None: the folder's own
    # safetensors files (loaders.weight_sources.FolderWeightSources). A loader that renames keys sets its own.
    weight_sources: Any = None


DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")

# Every model loaded and still alive, by key. Weak, so that what keeps a model alive is decided in one place:
# ``_kept`` below, or (inside ComfyUI, see ``follow_host_node_cache``) the host's node cache holding its handles.
_cache: "weakref.WeakValueDictionary[tuple, LoadedModel]" = weakref.WeakValueDictionary()
_kept: dict[tuple, LoadedModel] = {}  # the store's own strong references, unless the host owns model lifetime
_host_owns_lifetime = False
_load_counts: dict[str, int] = {}
_lock = threading.Lock()


def detect_family(model_index: dict) -> str:
    """Model family id from a ``model_index.json`` dict (the family registry decides); ``ModelLoadError`` for
    unsupported pipelines."""
    from .families import detect_model_family

    return detect_model_family(model_index)


def require_libraries(model_index: dict, family: str, label: str) -> None:
    """Refuse, naming the versions needed, when the installed libraries are older than a folder's model needs:
    its family's, or a later variant's (Wan2.2 TI2V is a one-transformer Wan pipeline that came with Wan2.2)."""
    from .families import family_by_id

    compat.require(family_by_id(family).requirements_id(family, model_index=model_index), label)


def denoiser_names(model_index: dict) -> list[str]:
    """The denoiser components that are set, as the folder's family names them (the main one first)."""
    from .families import denoiser_components

    return denoiser_components(model_index)


def resolve_dtype(dtype):
    """``None``/"auto" -> None (the folder's own dtype), a name from ``DTYPE_NAMES`` or a ``torch.dtype``."""
    import torch

    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in DTYPE_NAMES:
        return getattr(torch, dtype)
    raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {list(DTYPE_NAMES)}")


@contextlib.contextmanager
def quiet_library_progress():
    """Silence diffusers'/transformers' per-component tqdm bars ("Loading pipeline components", "Writing model
    shards") while loading or saving (the runtime shows its own progress), and torch's FutureWarning about
    ``torch.nn.utils.weight_norm``: diffusers' audio VAEs (MiniMax-H3's) still build with it, on every load,
    and nothing a user does can change that. The previous settings are restored afterwards."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    loggers = [lg for lg in (diffusers_logging, transformers_logging) if lg.is_progress_bar_enabled()]
    for lg in loggers:
        lg.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*torch\.nn\.utils\.weight_norm.* is deprecated",
                                    category=FutureWarning)
            yield
    finally:
        for lg in loggers:
            lg.enable_progress_bar()


def _load_pipeline(path: str, family: str, model_index: dict, dtype):
    """The pipeline for a folder, loaded the way its family loads it (MiniMax-H3 is a modular pipeline)."""
    from .families import family_by_id
    from .families.interface import PipelineSource

    return family_by_id(family).load_pipeline(PipelineSource(path=path, model_index=model_index, dtype=dtype))


def refuse_pickle_weights(folder: Path, model_index: dict) -> None:
    """A component whose weights exist only in a pickle format (``diffusion_pytorch_model.bin``...) is refused,
    naming the file: unpickling runs code. ``use_safetensors=True`` makes the libraries refuse it too, but
    with a message about a missing ``.safetensors`` file that does not say why."""
    from .lora.reader import PICKLE_SUFFIXES

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


def load_model(path, *, name: str = "", dtype=None, device=None, memory=None, attention: str = "native",
               compile: bool = False, on_progress=None, before_device_alloc=None,
               load_workers: int | None = None) -> LoadedModel:
    """The shared ``LoadedModel`` for a diffusers folder, placed on ``device`` under a memory plan.

    Loaded once per (resolved path, index mtime, dtype, device, memory, attention, compile). ``device``/``memory``
    None or "auto" follow ``loaders.devices`` (session defaults, then the best device / the planner's choice).
    The plan is chosen from the configs before any weight is read; one that does not fit raises
    ``ModelLoadError`` saying what is needed, what is free and which plan would work. ``before_device_alloc(bytes,
    device)`` runs just before our weights take device memory (ComfyUI frees its own models there);
    ``on_progress(done, total)`` follows loading and placing the components.
    Offline only (``local_files_only``): a folder that needs the hub fails with a message naming the folder.
    ``load_workers`` (default ``default_load_workers(folder)``) > 1 loads a sharded model's files in parallel
    (``parallel_loading``: 283 s -> 56 s for a 64.5 GiB Wan2.2-I2V-A14B folder in vllm-omni's measurement).
    """
    folder = Path(path).expanduser().resolve()
    label = name or folder.name
    with _errors_name_the_model(folder, label):
        return _load_model(folder, label, dtype, device, memory, attention, compile, on_progress,
                           before_device_alloc, load_workers)


@contextlib.contextmanager
def _errors_name_the_model(folder: Path, label: str):
    """A ``ModelLoadError`` names the model by ``label`` (its name under the models folder), never by its absolute
    path: the message reaches the browser and ``/history``. Library messages quoting the folder's files are
    rewritten the same way (``tiny-wan21-t2v/transformer/diffusion_pytorch_model.safetensors``)."""
    try:
        yield
    except ModelLoadError as exc:
        if str(folder) not in str(exc):
            raise
        raise ModelLoadError(str(exc).replace(str(folder), label)) from exc.__cause__


def _load_model(folder: Path, label: str, dtype, device, memory, attention, compile, on_progress,
                before_device_alloc, load_workers) -> LoadedModel:
    from . import load_plan, placement, speed
    from .devices import resolve_device, resolve_memory
    from .families import family_by_id

    index_file = folder / "model_index.json"
    model_index = read_model_index(folder)
    torch_dtype = resolve_dtype(dtype)
    torch_device = resolve_device(device)
    memory_name = resolve_memory(memory)
    key = (str(folder), index_file.stat().st_mtime_ns, str(torch_dtype), str(torch_device), memory_name,
           attention, bool(compile))

    def load() -> LoadedModel:
        family = detect_family(model_index)
        require_libraries(model_index, family, f"{label} ({family})")
        refuse_pickle_weights(folder, model_index)
        speed.check_attention(attention, torch_device)
        plan = load_plan.choose_plan(folder, model_index, device=torch_device, memory=memory_name, dtype=torch_dtype)
        if before_device_alloc is not None and torch_device.type != "cpu":
            before_device_alloc(plan.peak_device_bytes, torch_device)
        try:
            workers = default_load_workers(folder) if load_workers is None else load_workers
            with quiet_library_progress(), shard_loading(workers):
                pipeline = _load_pipeline(str(folder), family, model_index, torch_dtype)
        except Exception as exc:
            raise ModelLoadError(f"{label}: cannot load the {family} pipeline: {exc}") from exc
        if hasattr(pipeline, "set_progress_bar_config"):
            pipeline.set_progress_bar_config(disable=True)  # progress goes through our own per-step callback
        components = _denoisers(pipeline, model_index, label, family)
        placed = placement.ModelPlacement(dict(pipeline.components), plan, torch_device,
                                          family_by_id(family).component_roles(model_index))
        placed.apply(on_progress)
        speed.apply_speed_options(components, attention=attention, compile=compile)
        _load_counts[str(folder)] = _load_counts.get(str(folder), 0) + 1
        return LoadedModel(
            path=str(folder), name=label, family=family, pipeline=pipeline,
            components=components, model_index=model_index, placement=placed,
        )

    return load_shared(key, load)


def _denoisers(pipeline, model_index: dict, label: str, family: str) -> dict:
    """{name: module} of the index's denoisers, in eval mode without gradients; one the installed diffusers
    dropped (an older release ignores an unknown component with only a warning) is refused by name."""
    listed = denoiser_names(model_index)
    components = {n: getattr(pipeline, n) for n in listed if getattr(pipeline, n, None)}
    dropped = sorted(set(listed) - set(components))
    if dropped:
        raise ModelLoadError(f"{label}: model_index.json lists {dropped} but the installed diffusers did not "
                             f"load them; {family} needs a newer diffusers")
    for module in components.values():
        module.eval().requires_grad_(False)
    return components


def load_shared(key: tuple, load: Callable[[], LoadedModel]) -> LoadedModel:
    """The one shared model for ``key``, loaded by ``load()`` on a miss (under the cache lock, so two callers never
    load it twice). A key is ``(source, version, *options)``: the source's resolved path(s), their mtime(s), then
    dtype, device, plan and speed options. A new version of the same source with the same options (a rebuilt
    folder, a replaced file) replaces the stale entry instead of keeping both models alive. Used by the folder
    loader and by ``loaders.single_file``, so clearing or unloading the cache covers both."""
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            if cached.placement is not None:
                cached.placement.ensure_placed()
            return cached
        model = load()
        for stale in [k for k in _cache if k[0] == key[0] and k[2:] == key[2:]]:
            _kept.pop(stale, None)
            _release(_cache.pop(stale))
        _cache[key] = model
        if not _host_owns_lifetime:
            _kept[key] = model
        return model


def follow_host_node_cache() -> None:
    """From now on a model lives exactly as long as something outside the store holds it (its handles in the
    host's node cache), instead of until ``clear_cache``.

    Why: inside ComfyUI the node cache decides what stays in memory. Its "Free model and node cache" drops the
    cached node outputs and collects garbage, and that must free our models too (RAM on a CPU machine, where
    "unload models" has no device memory to give back). Models already loaded stay while their handles do.
    Headless, the runtime keeps the store's own references (its ``/free`` calls ``clear_cache``)."""
    global _host_owns_lifetime
    with _lock:
        _host_owns_lifetime = True
        _kept.clear()


def _release(model: LoadedModel) -> None:
    if model.placement is not None:
        model.placement.release()


def release_device_memory() -> int:
    """Give every cached model's device memory back (ComfyUI's "unload models"); they stay loaded on the host
    and return to the device on their next use. Returns how many models held a placement."""
    with _lock:
        models = list(_cache.values())
    for model in models:
        _release(model)
    return sum(1 for m in models if m.placement is not None)


def load_count(path) -> int:
    """How many times ``path`` was actually loaded from disk (cache misses), for tests and diagnostics."""
    return _load_counts.get(str(Path(path).expanduser().resolve()), 0)


def loaded_models() -> list[LoadedModel]:
    """Every model loaded now (a scaled-out replica reports the fuse work done on them)."""
    with _lock:
        return list(_cache.values())


def clear_cache() -> None:
    """Forget every loaded model (tests; the server's "free memory" request), giving device memory back first."""
    with _lock:
        for model in list(_cache.values()):
            _release(model)
        _cache.clear()
        _kept.clear()
