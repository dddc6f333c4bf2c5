"""Bind a shared ``LoadedModel`` to exactly the state a handle asks for: base weights + fuses + active adapters.

Why "binding" at sampling time: handles only *describe* a patch set (several graph branches can share one
loaded model with different LoRAs), so right before denoising the sampler makes the model match its handle.
Binding is incremental (the patcher rewrites only parameters whose set of contributions changed — re-running
the same patch set writes nothing) and transactional (every file, key and shape is validated before the first
weight is written; an error or interrupt part-way restores everything touched, then re-raises).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..families import family_for, guess_family
from ..io.weight_sources import FolderWeightSources
from ..lora.preparation import prepare_lora
from .patching import ApplyResult, PatchLayer, WeightPatcher
from .peft_adapters import AdapterCache, cache_key, file_identity, to_peft_groups

DEFAULT_MAX_CACHED_ADAPTERS = 4
MAX_MEMOISED_ACCOUNTINGS = 16
_state_creation_lock = threading.Lock()


@dataclass
class BindStats:
    """Cumulative engine work on one model (tests assert that a repeated bind does no work)."""

    bind_calls: int = 0
    fuse_passes: int = 0  # binds that wrote or restored at least one tensor
    tensors_written: int = 0
    tensors_restored: int = 0


@dataclass
class BindingState:
    """What the engine keeps on ``LoadedModel.binding_state``."""

    patcher: WeightPatcher
    adapters: AdapterCache
    stats: BindStats = field(default_factory=BindStats)
    fuses: tuple = ()  # the FuseSpecs currently fused
    # one bind at a time per model: two graph branches binding the same shared model must not interleave
    lock: threading.RLock = field(default_factory=threading.RLock)
    # (content key, component, lenient) -> (targets, accounting dict): a sampler re-binds the same files on every
    # run; mapping and accounting them again would cost more than the (empty) incremental fuse
    accounted: "OrderedDict[tuple, tuple]" = field(default_factory=OrderedDict)
    # bumped by every bind or unbind that writes or restores a weight: what a fingerprint of the bound weights
    # was made at (``distributed.fingerprints`` keeps its last one in ``rank_fingerprint``, made again on change)
    version: int = 0
    rank_fingerprint: Any = None


@dataclass
class BindReport:
    # per fuse: name, component, strength, accounting dict; per active adapter: name, component, scale, accounting.
    # Files are named as the graph names them (relative to the loras folder), never by path: the report is the
    # sampler's UI output, which reaches the browser and /history.
    fuses: list = field(default_factory=list)
    adapters: list = field(default_factory=list)
    written: int = 0  # tensors (re)patched by this bind
    restored: int = 0  # tensors returned to their original by this bind
    unchanged: int = 0  # patched tensors left as they were (same contributions)
    warnings: list = field(default_factory=list)
    # per component: how patched weights' originals are kept, {"file": n, "file_bytes", "ram": n, "ram_bytes"}
    restore_sources: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "fuses": self.fuses,
            "adapters": self.adapters,
            "written": self.written,
            "restored": self.restored,
            "unchanged": self.unchanged,
            "warnings": list(self.warnings),
            "restore_sources": self.restore_sources,
        }


_cache_defaults = {"max_size": DEFAULT_MAX_CACHED_ADAPTERS, "pinned": ()}


def set_adapter_cache_defaults(*, max_size: Optional[int] = None, pinned_paths: Sequence[str] = ()) -> None:
    """Session defaults for every model's PEFT adapter cache (``serve --max-cached-adapters/--preload-adapter``):
    its size, and LoRA files kept cached once loaded (on every denoiser) whatever the LRU says."""
    if max_size is not None and max_size < 1:
        raise ValueError(f"the adapter cache holds at least 1 adapter, got {max_size}")
    if max_size is not None:
        _cache_defaults["max_size"] = int(max_size)
    _cache_defaults["pinned"] = tuple(pinned_paths)


def set_adapter_cache_size(model, max_size: int) -> None:
    """This model's adapter cache size (a loader's ``max_cached_adapters`` input); takes effect at the next bind."""
    binding_state(model).adapters.max_size = max(1, int(max_size))


def binding_state(model) -> BindingState:
    """The engine state of a loaded model, created on first use."""
    with _state_creation_lock:
        if model.binding_state is None:
            # originals re-read from the model's safetensors files where possible (no RAM copy), see weight_sources
            sources = getattr(model, "weight_sources", None) or FolderWeightSources(model.path)
            model.binding_state = BindingState(
                patcher=WeightPatcher(model.components, weight_sources=sources),
                adapters=AdapterCache(model.components, max_size=_cache_defaults["max_size"]),
            )
            if getattr(model, "placement", None) is not None:  # weights re-read from their file get their patches
                model.placement.patch_writer = model.binding_state.patcher.rewrite
            for path in _cache_defaults["pinned"]:
                for component in model.components:
                    model.binding_state.adapters.pin(path, component)
    return model.binding_state


def bind(model, fuses: Sequence, adapters: Sequence, *, lenient: bool = False,
         check_interrupt: Optional[Callable[[], None]] = None,
         on_progress: Optional[Callable[[int, int], None]] = None) -> BindReport:
    """Bring ``model.components`` to base weights + ``fuses`` and activate exactly ``adapters``.

    ``fuses`` are ``FuseSpec``s, ``adapters`` ``AdapterSpec``s (scale 0 = off: not even read). Raises
    ``LoraBindError`` subclasses naming the file/key; on any error the model is left as it was before the call.
    ``on_progress(done, total)`` follows the layers being (re)patched: fusing a 14B expert takes minutes on a CPU.
    """
    state = binding_state(model)
    adapters = [_on_component(model, spec) for spec in adapters]
    with state.lock:
        if not fuses and not any(float(spec.scale) for spec in adapters) and _holds_base_weights(state):
            # Nothing asked, nothing bound (every run of a workflow without LoRAs): nothing to plan, write or
            # report. The full path's bookkeeping cost more than the rest of the sampler's set-up on a rerun.
            # The memory plan still hears of the bind, with nothing written, as the full path would tell it.
            state.stats.bind_calls += 1
            _keep_under_plan(model, None)
            return BindReport(restore_sources=state.patcher.restore_sources())
        return _bind_locked(model, state, fuses, adapters, lenient, check_interrupt, on_progress)


def _holds_base_weights(state: BindingState) -> bool:
    """True when no fuse is bound, no parameter holds a patched value and no adapter is active."""
    return not state.fuses and not state.patcher.patched and not state.adapters.active


def _bind_locked(model, state: BindingState, fuses, adapters, lenient, check_interrupt, on_progress) -> BindReport:
    state.stats.bind_calls += 1
    report = BindReport()

    # 1. read, map and account everything; validate every shape. No weight is written yet.
    layers = []
    for spec in fuses:
        content_key = _content_key(spec.path)
        targets, accounting = _accounted_targets(model, state, spec, lenient or spec.lenient, content_key)
        layers.append(PatchLayer(key=content_key, component=spec.component,
                                 strength=float(spec.strength), targets=targets, name=_label(spec)))
        report.fuses.append({"name": _label(spec), "component": spec.component,
                             "strength": float(spec.strength), "accounting": copy.deepcopy(accounting)})
    state.patcher.plan(layers)
    wanted_adapters = []
    for spec in adapters:
        if float(spec.scale) == 0:
            continue  # off: no weights, no contract, nothing to validate
        targets, accounting = _accounted_targets(model, state, spec, lenient or spec.lenient,
                                                 _content_key(spec.path))
        key = cache_key(spec.path, spec.component)
        groups = None if key in state.adapters.entries else to_peft_groups(targets, _label(spec))
        wanted_adapters.append((key, spec, groups))
        report.adapters.append({"name": _label(spec), "component": spec.component,
                                "scale": float(spec.scale), "accounting": copy.deepcopy(accounting)})

    cache = state.adapters
    previous_active = dict(cache.active)
    warnings_before = len(cache.warnings)
    try:
        # 2. adapters first: injecting and activating never writes a base weight, so undoing it is exact.
        in_use = {key for key, _, _ in wanted_adapters}
        scales: dict = {}
        for key, spec, groups in wanted_adapters:
            if groups is not None and getattr(model, "placement", None) is not None:
                model.placement.activate(spec.component)  # peft injects next to real weights, not ones in a file
            cache.ensure(key, spec.component, groups, _label(spec), in_use=in_use)
            scales[key] = scales.get(key, 0.0) + float(spec.scale)
        cache.activate(scales)
        # 3. fuse: incremental and transactional inside the patcher.
        result: ApplyResult = state.patcher.apply(layers, check_interrupt=check_interrupt, on_progress=on_progress)
    except BaseException:
        cache.activate({k: s for k, s in previous_active.items() if k in cache.entries})
        _keep_under_plan(model, None)  # weights are as before; adapter layers may have been injected
        raise
    _keep_under_plan(model, state.patcher)
    report.warnings.extend(cache.warnings[warnings_before:])
    state.fuses = tuple(fuses)
    report.written, report.restored, report.unchanged = result.written, result.restored, result.unchanged
    report.restore_sources = state.patcher.restore_sources()
    if result.written or result.restored:
        state.stats.fuse_passes += 1
        state.version += 1
    state.stats.tensors_written += result.written
    state.stats.tensors_restored += result.restored
    return report


def prepared_targets(model, spec) -> dict:
    """What ``spec`` (a FuseSpec or an AdapterSpec) does to ``model``: {module path: TargetPatch}, read, mapped and
    accounted exactly as ``bind`` will (and memoised for it), without writing a weight. Raises the same
    ``LoraBindError`` naming the file or key that ``bind`` would: the step engine checks each request's files
    here, on the request's own thread, so a bad file fails that request alone and before it joins a batch."""
    state = binding_state(model)
    spec = _on_component(model, spec)
    with state.lock:
        return _accounted_targets(model, state, spec, spec.lenient, _content_key(spec.path))[0]


def unbind(model) -> None:
    """Restore every base weight bit-exactly and deactivate every adapter (they stay cached)."""
    state = model.binding_state
    if state is None:
        return
    with state.lock:
        state.adapters.activate({})
        result = state.patcher.restore_all()
        _keep_under_plan(model, state.patcher)
        state.fuses = ()
        state.stats.tensors_restored += result.restored
        state.version += 1


def main_denoiser(model) -> str:
    """The model's main denoiser: its family lists it first among ``model.components``."""
    return next(iter(model.components))


def _on_component(model, spec):
    """An adapter spec with its component named (an ``AdapterSpec`` without one attaches to the main denoiser)."""
    return spec if spec.component else dataclasses.replace(spec, component=main_denoiser(model))


def release_adapters(model) -> None:
    """Delete every cached adapter from the model (its state dict is then bit-identical to before)."""
    state = model.binding_state
    if state is not None:
        with state.lock:
            state.adapters.remove_all()
            _keep_under_plan(model, None)


# ---------------------------------------------------------------------------------------------- helpers


def _keep_under_plan(model, patcher) -> None:
    """Tell the model's memory plan what a bind changed, so no copy of a weight it keeps goes stale
    (``loaders.placement``: staged copies, group-offload hooks)."""
    placement = getattr(model, "placement", None)
    if placement is not None:
        placement.after_bind(patcher.last_written_tensors() if patcher is not None else {})


def _label(spec) -> str:
    return spec.name or os.path.basename(spec.path.rstrip("/\\"))


def _content_key(path: str) -> str:
    """Same file content ⇒ same key: resolved path plus size and mtime of the file(s)."""
    resolved = os.path.realpath(path)
    return f"{resolved}|{file_identity(resolved)}"


def _accounted_targets(model, state: BindingState, spec, lenient: bool, content_key: str):
    """``prepare_lora`` for one spec (memoised per ``content_key``, the caller's ``_content_key(spec.path)``):
    (targets, accounting dict)."""
    memo_key = (content_key, spec.component, bool(lenient))
    hit = state.accounted.get(memo_key)
    if hit is not None:
        state.accounted.move_to_end(memo_key)
        return hit
    prepared = prepare_lora(spec.path, model, spec.component, family_for(model), guess_family=guess_family,
                            name=_label(spec), lenient=lenient)
    state.accounted[memo_key] = (prepared.targets, prepared.accounting.to_dict())
    while len(state.accounted) > MAX_MEMOISED_ACCOUNTINGS:
        state.accounted.popitem(last=False)
    return state.accounted[memo_key]
