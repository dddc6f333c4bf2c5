"""Dynamic (unfused) adapters injected with peft, and a per-model LRU cache of them.

Why peft layers and not fusing: switching adapters per run must not write a single base weight (milliseconds,
and the base stays bit-exact). Why not diffusers' ``load_lora_adapter``/``load_lora_weights``: diffusers drops
``lora_alpha`` of PEFT folders when given a path (the adapter then runs at alpha=r, i.e. the wrong scale) and
drops full diffs silently. So every adapter — PEFT folder or single LoRA file — first goes through our reader
(``MappedLora``: every pair already carries its exact resolved ``scale``), and we hand peft a state dict in
which that scale is folded into B with ``lora_alpha = r``: each layer then runs at exactly ``scale · run scale``.

Each cached adapter is injected once into its component (one peft adapter per rank present in the file, so
mixed-rank files need no ``rank_pattern``, whose matching rules differ between peft versions). A run activates
a set of adapters with scales; scale 0 means off. Files carrying full diffs (``diff`` on weights, ``diff_m``,
norm diffs) cannot be dynamic: they are refused with a pointer to the fuse node.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import torch
from torch import nn

from .. import fp8, gguf_weights
from ..errors import LoraBindError
from ..io.file_identity import file_identity
from ..lora import kinds
from .sharded_deltas import refuse_unfused_adapters

# How a layer that stores its weight in a compact form says which dtype it computes in (None: it does not):
# peft gives new adapter weights the base weight's dtype, which over such storage is not the compute dtype
STORED_COMPUTE_DTYPES = (fp8.compute_dtype, gguf_weights.compute_dtype)

FUSE_NODE_HINT = "load it with the FuseDistillLoRA node instead (fused LoRAs support full diffs)"


class AdapterError(LoraBindError):
    """An adapter cannot be used dynamically (full diffs, unsupported peft version, peft refused the weights)."""


def cache_key(path: str, component: str) -> tuple:
    """Cache key of an adapter on one component: resolved path + file identity + component."""
    resolved = os.path.realpath(path)
    return (resolved, file_identity(resolved), component)


# ---------------------------------------------------------------------------------------------- conversion


@dataclass
class PeftRankGroup:
    """One peft adapter to inject: every target of one adapter kind and rank, scales folded into the tensors."""

    kind: str
    settings: tuple  # the kind's tuner settings shared by these modules (``PeftForm.tensors``), rank "r" among them
    modules: tuple  # exact module paths
    state_dict: dict  # the kind's peft tensors per module (e.g. "<module>.lora_A.weight", "<module>.hada_w1_a")
    with_bias: bool

    @property
    def rank(self) -> int:
        return dict(self.settings)["r"]


def to_peft_groups(targets: Mapping[str, object], label: str) -> list[PeftRankGroup]:
    """Convert canonical ``TargetPatch``es into peft state dicts, one per (adapter kind, rank).

    Each kind with a ``PeftForm`` gives its tensors with the delta's scale folded in, so the tuner at scaling 1
    reproduces exactly the delta the fuse path applies. A ``diff_b`` (bias diff) goes where the kind's tuner
    keeps a bias (the LoRA tuner's ``lora_B.bias``); any other full diff cannot be expressed by an adapter layer
    and is refused.
    """
    by_group: dict[tuple, dict] = {}
    modules_of: dict[tuple, set] = {}
    biased: set[tuple] = set()
    for module_path, target in sorted(targets.items()):
        extra = sorted(set(target.param_diffs) - {"bias"})
        if extra or (target.param_diffs and target.low_rank is None):
            what = ", ".join(f"{module_path}.{p}" for p in (extra or sorted(target.param_diffs)))
            raise AdapterError(
                f"'{label}' carries full diffs ({what}); a dynamic adapter can only add low-rank deltas — "
                f"{FUSE_NODE_HINT}."
            )
        if target.low_rank is None:
            continue
        delta = target.low_rank
        form = kinds.by_name(delta.kind).peft_form
        if form is None:
            raise AdapterError(
                f"'{label}': '{module_path}' is a {delta.kind} adapter, which must be fused: adapter kinds that "
                f"run unfused are {', '.join(kinds.unfused_kinds())}; {', '.join(kinds.fused_only_kinds())} "
                f"run fused only — {FUSE_NODE_HINT}."
            )
        try:
            tensors, settings = form.tensors(module_path, delta)
        except ValueError as exc:
            raise AdapterError(f"'{label}': {exc} — {FUSE_NODE_HINT}.") from None
        group = (delta.kind, settings)
        by_group.setdefault(group, {}).update(tensors)
        modules_of.setdefault(group, set()).add(module_path)
        if "bias" in target.param_diffs:
            if form.bias_key is None:
                raise AdapterError(f"'{label}': '{module_path}' has a bias diff, which a dynamic {delta.kind} "
                                   f"adapter cannot carry — {FUSE_NODE_HINT}.")
            by_group[group][f"{module_path}.{form.bias_key}"] = target.param_diffs["bias"].to(torch.float32)
            biased.add(group)
    groups = []
    for (kind, settings), sd in sorted(by_group.items()):
        modules = tuple(sorted(modules_of[(kind, settings)]))
        with_bias = (kind, settings) in biased
        if with_bias:  # peft gives every layer of a lora_bias adapter a bias: zeros where the file has none
            bias_key = kinds.by_name(kind).peft_form.bias_key
            for m in modules:
                if f"{m}.{bias_key}" not in sd:
                    layer_weight = sd[f"{m}.{bias_key.rsplit('.', 1)[0]}.weight"]  # the layer the bias belongs to
                    sd[f"{m}.{bias_key}"] = torch.zeros(layer_weight.shape[0])
        groups.append(PeftRankGroup(kind, settings, modules, sd, with_bias))
    if not groups:
        raise AdapterError(f"'{label}' has no low-rank targets on this component; nothing to attach dynamically.")
    return groups


def _peft_config(group: PeftRankGroup, label: str):
    # a regex string is matched with re.fullmatch by peft: exact module paths, no suffix surprises
    target_modules = "^(?:" + "|".join(re.escape(m) for m in group.modules) + ")$"
    try:
        return kinds.by_name(group.kind).peft_form.config(target_modules, group.with_bias, group.settings)
    except ValueError as exc:
        raise AdapterError(f"'{label}': {exc} — upgrade peft or {FUSE_NODE_HINT}.") from None


# ---------------------------------------------------------------------------------------------- cache


@dataclass
class CachedAdapter:
    key: tuple  # cache_key(path, component)
    label: str
    component: str
    peft_names: tuple  # peft adapter names injected into the component (one per rank)


@dataclass
class AdapterCache:
    """LRU cache of adapters injected into one model's components.

    Eviction (deleting the peft layers) never drops an adapter that is pinned or in use (requested by the
    bind in progress); when everything is in use the cache grows past ``max_size`` and says so in ``warnings``
    instead of failing the run.
    """

    components: Mapping[str, nn.Module]
    max_size: int = 4
    entries: "OrderedDict[tuple, CachedAdapter]" = field(default_factory=OrderedDict)
    active: dict = field(default_factory=dict)  # cache key -> scale
    pinned: set = field(default_factory=set)  # (resolved path, component): never evicted, whatever its identity
    warnings: list = field(default_factory=list)
    injections: int = 0  # how many adapters were injected (tests: a cached adapter is not re-injected)
    _counter: int = 0
    _had_peft_config: dict = field(default_factory=dict)
    # (active scales, cached keys) the peft layers were last set to: a re-run activating the same set skips the walk
    # over every layer of the model (the bulk of a seed-only re-run's own overhead on small models)
    _applied: Optional[tuple] = None

    # -- loading

    def ensure(self, key: tuple, component: str, groups: Sequence[PeftRankGroup], label: str,
               in_use: Optional[Iterable[tuple]] = None) -> CachedAdapter:
        """Return the cached adapter for ``key``, injecting ``groups`` (``to_peft_groups``) if it is not cached.

        ``in_use``: the keys that must survive eviction — the set the caller is about to activate (a bind that
        replaces the active set passes it); by default the adapters active now.
        """
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            return entry
        if not groups:
            raise AdapterError(f"'{label}' is not cached on '{component}' and no peft weights were given")
        protected = set(self.active if in_use is None else in_use) | {key}
        self._drop_stale(key, protected)
        self._evict_for_one_more(protected)
        entry = self._inject(key, component, groups, label)
        self.entries[key] = entry
        return entry

    def pin(self, path: str, component: str, pinned: bool = True) -> None:
        """Keep this file's adapter on ``component`` cached once loaded (the file need not be loaded yet)."""
        ident = (os.path.realpath(path), component)
        if pinned:
            self.pinned.add(ident)
        else:
            self.pinned.discard(ident)

    def is_pinned(self, key: tuple) -> bool:
        return (key[0], key[2]) in self.pinned

    def _drop_stale(self, key: tuple, protected: set) -> None:
        """An older identity of the same file on the same component is dead weight: remove it (if unused)."""
        for old in [k for k in self.entries if k[0] == key[0] and k[2] == key[2] and k not in protected]:
            self._remove(old)

    def _evict_for_one_more(self, in_use: set) -> None:
        while len(self.entries) >= self.max_size:
            victim = next((k for k in self.entries if k not in in_use and not self.is_pinned(k)), None)
            if victim is None:
                self.warnings.append(
                    f"adapter cache full ({len(self.entries)}/{self.max_size}) but every cached adapter is pinned "
                    f"or in use; keeping them all"
                )
                return
            self._remove(victim)

    def _inject(self, key: tuple, component: str, groups: Sequence[PeftRankGroup], label: str) -> CachedAdapter:
        from peft import inject_adapter_in_model, set_peft_model_state_dict

        module = self.components[component]
        refuse_unfused_adapters(module, label)
        if component not in self._had_peft_config:
            self._had_peft_config[component] = hasattr(module, "peft_config")
        self._counter += 1
        names = []
        try:
            for index, group in enumerate(groups):
                name = f"lorabind{self._counter}_{index}_{group.kind}{group.rank}"
                config = _peft_config(group, label)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # peft's false "invalid shape" warning for lora_B.bias
                    inject_adapter_in_model(config, module, adapter_name=name)
                    names.append(name)
                    _adapters_in_compute_dtype(module, name)
                    result = set_peft_model_state_dict(module, group.state_dict, adapter_name=name)
                unexpected = [k for k in getattr(result, "unexpected_keys", [])
                              if any(k.startswith(f"{m}.") for m in group.modules)]
                if unexpected:
                    raise AdapterError(f"peft did not accept {len(unexpected)} tensors of '{label}': {unexpected[:5]}")
        except BaseException:
            for name in names:
                _delete_peft_adapter(module, name)
            _unwrap_empty_peft_layers(module)
            self._apply_activation()
            raise
        self.injections += 1
        entry = CachedAdapter(key, label, component, tuple(names))
        self._apply_activation()  # a fresh peft adapter starts active: keep exactly the wanted set active
        return entry

    def _remove(self, key: tuple) -> None:
        entry = self.entries.pop(key)
        self.active.pop(key, None)
        module = self.components[entry.component]
        for name in entry.peft_names:
            _delete_peft_adapter(module, name)
        _unwrap_empty_peft_layers(module)
        if not any(e.component == entry.component for e in self.entries.values()):
            if not self._had_peft_config.pop(entry.component, True) and hasattr(module, "peft_config"):
                del module.peft_config
        self._apply_activation()  # peft re-activates a remaining adapter when the active one is deleted

    def remove_all(self) -> None:
        """Delete every cached adapter: the components' state dicts are then bit-identical to before."""
        for key in list(self.entries):
            self._remove(key)

    # -- activation

    def activate(self, scales: Mapping[tuple, float]) -> None:
        """Make exactly these cached adapters active with these scales (0 = off); base weights untouched."""
        missing = [k for k in scales if k not in self.entries]
        if missing:
            raise AdapterError(f"adapter(s) not loaded: {[k[0] for k in missing]}")
        self.active = {k: float(s) for k, s in scales.items() if s != 0}
        for key in self.active:
            self.entries.move_to_end(key)
        if self._applied != self._activation_state():
            self._apply_activation()

    def _activation_state(self) -> tuple:
        return frozenset(self.active.items()), frozenset(self.entries)

    def _apply_activation(self) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self._applied = None  # unknown until every layer is set

        per_component: dict[str, dict[str, float]] = {}
        for key, scale in self.active.items():
            entry = self.entries[key]
            for name in entry.peft_names:
                per_component.setdefault(entry.component, {})[name] = scale
        for component, module in self.components.items():
            wanted = per_component.get(component, {})
            for layer in module.modules():
                if not isinstance(layer, BaseTunerLayer):
                    continue
                present = [n for n in wanted if n in getattr(layer, "scaling", {})]
                layer.set_adapter(present)
                for name in present:
                    layer.set_scale(name, wanted[name])
                for layer_name in layer.adapter_layer_names:  # inference only: no autograd on adapter weights
                    for sub in getattr(layer, layer_name).values():
                        sub.requires_grad_(False)
        self._applied = self._activation_state()


def _adapters_in_compute_dtype(root: nn.Module, adapter_name: str) -> None:
    """Over fp8 or GGUF storage an adapter's weights take the layer's compute dtype (call right after injection,
    before the adapter's weights are loaded); over an ordinary weight peft's choice stands."""
    for layer in root.modules():
        base = getattr(layer, "get_base_layer", None)
        if base is None:
            continue
        dtype = next((d for d in (ask(base()) for ask in STORED_COMPUTE_DTYPES) if d is not None), None)
        if dtype is None:
            continue
        for layer_name in getattr(layer, "adapter_layer_names", ()):
            adapters = getattr(layer, layer_name)
            if adapter_name in adapters:
                adapters[adapter_name].to(dtype=dtype)


def _delete_peft_adapter(module: nn.Module, name: str) -> None:
    from peft.tuners.tuners_utils import BaseTunerLayer

    for layer in module.modules():
        if isinstance(layer, BaseTunerLayer) and name in getattr(layer, "scaling", {}):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                layer.delete_adapter(name)
    config = getattr(module, "peft_config", None)
    if isinstance(config, dict):
        config.pop(name, None)


def _unwrap_empty_peft_layers(module: nn.Module) -> None:
    """Put the original layer back where a peft wrapper has no adapter left.

    peft's functional ``delete_adapter`` keeps the wrapper (state-dict keys then read ``….base_layer.weight``)
    and only ``PeftModel.unload`` unwraps; we use bare models, so we unwrap ourselves.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    for path, layer in list(module.named_modules()):
        if not isinstance(layer, BaseTunerLayer) or any(len(getattr(layer, name)) for name in
                                                        layer.adapter_layer_names):
            continue
        parent_path, _, child = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        setattr(parent, child, layer.get_base_layer())
