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
import logging
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..distributed import context_parallel
from ..distributed.process_group import session_spec, tp_mesh
from ..errors import ModelLoadError
from ..families import denoiser_components, detect_model_family
from ..families.roles import DENOISER_ROLES
from ..io.weight_sources import FolderWeightSources
from ..placement import apply_plan as placement
from ..placement import load_plan, speed
from ..placement.devices import resolve_device, resolve_memory
from . import tensor_parallel
from .diffusers_folder import DiffusersFolder
from .split_loading import SplitLoad


@dataclass(eq=False)
class LoadedModel:
    path: str  # resolved diffusers folder
    name: str  # name relative to the models root, for messages
    family: str  # "wan2.1", "wan2.2_moe", "qwen_image", "minimax_h3"
    pipeline: Any  # the diffusers pipeline object (components shared with ``components``)
    components: dict = field(default_factory=dict)  # denoiser name -> torch.nn.Module
    model_index: dict = field(default_factory=dict)
    binding_state: Any = None  # owned by loaders.binding (patcher backups, active adapters)
    placement: Any = None  # loaders.placement.apply_plan.ModelPlacement: where each component lives under its memory plan
    # where each weight can be re-read from (``lookup(component, key) -> WeightSource``); None: the folder's own
    # safetensors files (loaders.io.weight_sources.FolderWeightSources). A loader that renames keys sets its own.
    weight_sources: Any = None
    # under ``--parallel tp=N``: one ``tensor_parallel.ShardReport`` per denoiser (what this rank holds of the
    # split parameters, against the whole model's bytes); empty when the model is whole
    tensor_parallel: tuple = ()


DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")

# Every model loaded and still alive, by key. Weak, so that what keeps a model alive is decided in one place:
# ``_kept`` below, or (inside ComfyUI, see ``follow_host_node_cache``) the host's node cache holding its handles.
_cache: "weakref.WeakValueDictionary[tuple, LoadedModel]" = weakref.WeakValueDictionary()
_kept: dict[tuple, LoadedModel] = {}  # the store's own strong references, unless the host owns model lifetime
_host_owns_lifetime = False
_load_counts: dict[str, int] = {}
_lock = threading.Lock()
# a warning, so that it shows where no handler is set up (``serve`` configures only its own logger)
log = logging.getLogger("lorabind.models")


def detect_family(model_index: dict) -> str:
    """Model family id from a ``model_index.json`` dict (the family registry decides); ``ModelLoadError`` for
    unsupported pipelines."""
    return detect_model_family(model_index)


def denoiser_names(model_index: dict) -> list[str]:
    """The denoiser components that are set, as the folder's family names them (the main one first)."""
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


def load_model(path, *, name: str = "", dtype=None, device=None, memory=None, attention: str = "native",
               compile: bool = False, on_progress=None, before_device_alloc=None,
               load_workers: int | None = None) -> LoadedModel:
    """The shared ``LoadedModel`` for a diffusers folder (``diffusers_folder.DiffusersFolder``: ``name``, and
    ``load_workers`` for a sharded folder), loaded by ``load`` with the other options.
    Offline only (``local_files_only``): a folder that needs the hub fails with a message naming the folder."""
    folder = Path(path).expanduser().resolve()
    label = name or folder.name
    with _errors_name_the_model(folder, label):
        return load(DiffusersFolder(folder, name=label, load_workers=load_workers), dtype=dtype, device=device,
                    memory=memory, attention=attention, compile=compile, on_progress=on_progress,
                    before_device_alloc=before_device_alloc)


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


def load(source, *, dtype=None, device=None, memory=None, attention: str = "native", compile: bool = False,
         on_progress=None, before_device_alloc=None) -> LoadedModel:
    """THE loading sequence, for every kind of ``model_sources.ModelSource``: the shared ``LoadedModel`` of
    ``source`` placed on ``device`` under a memory plan.

    Loaded once per (source and its version, dtype, the source's own options, device, memory, attention,
    compile). ``device``/``memory`` None or "auto" follow ``loaders.placement.devices`` (session defaults, then the best
    device / the planner's choice). The plan is chosen from configs and headers before any weight is read; one
    that does not fit raises ``ModelLoadError`` saying what is needed, what is free and which plan would work.
    ``before_device_alloc(bytes, device)`` runs just before our weights take device memory (ComfyUI frees its
    own models there); ``on_progress(done, total)`` follows placing the components.
    """
    torch_dtype = resolve_dtype(dtype) or source.default_dtype()
    torch_device = resolve_device(device)
    memory_name = resolve_memory(memory)
    identity, version = source.cache_identity()
    key = (identity, version, str(torch_dtype), *source.cache_options(), str(torch_device), memory_name, attention,
           bool(compile), session_spec().describe())

    def load_now() -> LoadedModel:
        source.check()
        context_parallel.check_attention(attention, torch_device.type)  # first: the split decides what is usable
        context_parallel.check_heads(source.denoiser_heads(), source.name)
        speed.check_attention(attention, torch_device)
        plan = load_plan.choose_plan(source, device=torch_device, memory=memory_name, dtype=torch_dtype)
        split = _split_load(source, plan, torch_device)
        if before_device_alloc is not None and torch_device.type != "cpu":
            before_device_alloc(plan.peak_device_bytes, torch_device)
        with quiet_library_progress():
            built = source.build(torch_dtype, split=split)
        if hasattr(built.pipeline, "set_progress_bar_config"):
            built.pipeline.set_progress_bar_config(disable=True)  # progress goes through our per-step callback
        for module in built.denoisers.values():
            module.eval().requires_grad_(False)
        placed = placement.ModelPlacement(built.modules, plan, torch_device, built.roles,
                                          weight_sources=built.weight_sources or FolderWeightSources(source.path))
        placed.apply(on_progress)
        speed.apply_speed_options(built.denoisers, attention=attention, compile=compile)
        context_parallel.apply_sequence_parallel(built.denoisers, torch_device)
        _load_counts[identity] = _load_counts.get(identity, 0) + 1
        loaded = LoadedModel(path=source.path, name=source.name, family=built.model_family, pipeline=built.pipeline,
                             components=built.denoisers, model_index=built.model_index, placement=placed,
                             weight_sources=built.weight_sources)
        if split is not None:  # a source that read its denoisers whole has them split now, before any bind
            unsplit = [name for name in built.denoisers if name not in split.reports]
            reports = tensor_parallel.apply_tensor_parallel(loaded, split.degree, only=unsplit) if unsplit else []
            loaded.tensor_parallel = (*split.reports.values(), *reports)
        return loaded

    return load_shared(key, load_now, label=source.name)


def _split_load(source, plan, device) -> SplitLoad | None:
    """Under ``--parallel tp=N``: the ``SplitLoad`` the source reads its denoisers through, after refusing,
    before any weight is read, a memory plan that would move them off the device; None otherwise."""
    degree = session_spec().tp
    if degree <= 1:
        return None
    denoisers = [name for name, role in source.component_roles().items() if role in DENOISER_ROLES]
    tensor_parallel.check_plan_keeps_denoisers(plan, denoisers, source.name)
    tensor_parallel.require_process_group(source.name, degree)
    mesh = tp_mesh(device.type)  # every rank, or under cfg=2 the ranks of this rank's guidance pass
    tensor_parallel.require_group(source.name, degree, mesh.get_group())
    return SplitLoad(degree, device, mesh)


def load_shared(key: tuple, load: Callable[[], LoadedModel], label: str = "") -> LoadedModel:
    """The one shared model for ``key``, loaded by ``load()`` on a miss (under the cache lock, so two callers never
    load it twice). A key is ``(source, version, *options)``: the source's resolved path(s), the identity of
    their files (``ModelSource.cache_identity``), then dtype, device, plan and speed options. A new version of the
    same source with the same options (a rebuilt folder, a replaced or rewritten file) drops the stale entry first,
    with one line in the log naming the model (``label``), and loads afresh: both are never alive at once, and a
    new version that fails to load leaves nothing stale behind. The version is computed before ``load()`` reads
    anything, so a file changed during the load makes the next call load again rather than keep a mixed model.
    Used by the folder loader and by ``loaders.models.single_file``, so clearing or unloading the cache covers
    both."""
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            if cached.placement is not None:
                cached.placement.ensure_placed()
            return cached
        _drop_older_versions(key, label)
        model = load()
        _cache[key] = model
        if not _host_owns_lifetime:
            _kept[key] = model
        return model


def _drop_older_versions(key: tuple, label: str) -> None:
    """Forget the models of ``key``'s source at another version with the same options. Why ``pop(k, None)``: the
    cache holds its models weakly, so dropping the store's own reference (``_kept``) may collect one and remove
    its entry before it is popped (issue 54: that raised a ``KeyError`` naming the folder's absolute path)."""
    stale = [k for k in list(_cache.keys()) if k[0] == key[0] and k[2:] == key[2:]]
    for old in stale:
        model = _cache.pop(old, None)
        _kept.pop(old, None)
        if model is not None:
            _release(model)
    if stale:
        log.warning("lorabind: %s changed on disk since it was loaded; loading it afresh", label or "a model")


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
