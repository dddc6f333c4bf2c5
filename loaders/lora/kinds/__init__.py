"""The registry of adapter kinds: adding a kind is one file in this package plus one entry in ``_BUILTIN``.

The full diffs (``full_diff.py``) are a kind too, but apart from ``_BUILTIN``: they patch named parameters
(weight, bias, modulation) next to whatever weight delta a module has, so they never compete for a module.

``register`` adds a kind at run time (a plug-in or a test); everything that reads, accounts, fuses or reports
LoRA files asks this registry, never a kind by name.
"""

from __future__ import annotations

from typing import Optional

from ...errors import LoraFileError
from . import dora, full_diff, loha, lokr, low_rank
from .base import AdapterKind, WeightDelta
from .full_diff import FullDiff

_BUILTIN = (low_rank.KIND, loha.KIND, lokr.KIND, dora.KIND)
_kinds: list = list(_BUILTIN)


def register(kind: AdapterKind) -> None:
    """Add (or replace, by name) an adapter kind."""
    _kinds[:] = [k for k in _kinds if k.name != kind.name] + [kind]


def unregister(name: str) -> None:
    """Remove a kind added by ``register`` (built-in kinds stay)."""
    _kinds[:] = [k for k in _kinds if k.name != name or k in _BUILTIN]


def all_kinds() -> tuple:
    return tuple(_kinds)


def _per_registry(compute):
    """``compute(registry)`` kept until the registry changes. Why: the suffixes and parts are asked for every key
    and module of every file read, and ``register``/``unregister`` are rare."""
    kept: list = [None, None]  # [the registry it was computed for, its value]

    def current():
        registry = tuple(_kinds)
        if kept[0] != registry:
            kept[:] = [registry, compute(registry)]
        return kept[1]
    current.__doc__ = compute.__doc__
    return current


@_per_registry
def suffix_parts(registry) -> tuple:
    """Every kind's ``(suffix, part)`` pairs, in registry order."""
    return tuple(pair for kind in registry for pair in kind.suffix_parts)


def full_diff_suffix_parts() -> tuple:
    """The full diffs' ``(suffix, part)`` pairs (matched after every other kind's and ``.alpha``)."""
    return full_diff.KIND.suffix_parts


def build_full_diffs(module: str, roles: dict, tensors, display_name: str, peft) -> dict:
    """{parameter: FullDiff} of a module's full-diff parts (``.diff``, ``.diff_b``, ``.diff_m``, ``lora_B.bias``)."""
    return full_diff.KIND.build(module, roles, tensors, display_name, peft)


@_per_registry
def delta_parts(registry) -> frozenset:
    """The ``source_keys`` parts that belong to a weight delta (every kind's parts plus ``alpha``)."""
    return frozenset(part for kind in registry for part in kind.parts) | {"alpha"}


def kind_for(parts) -> Optional[AdapterKind]:
    """The kind whose parts a module's parts include (None: no weight delta); a wrapping kind (DoRA) wins over the
    kind it wraps, otherwise the first registered wins."""
    parts = set(parts)
    for kind in sorted(_kinds, key=lambda k: not k.wraps):
        if kind.parts & parts:
            return kind
    return None


def build_delta(module: str, roles: dict, tensors, display_name: str, peft) -> Optional[WeightDelta]:
    """One module's weight delta from its ``roles`` (part -> raw key), built by the kind that claims them (None:
    the module has no weight-delta parts). A wrapping kind gets the delta of the remaining parts as ``inner``.
    Parts of two unrelated kinds on one module are refused, naming the file and key."""
    kind = kind_for(roles)
    if kind is None:
        return None
    inner_kind = kind_for({role for role in roles if role not in kind.parts}) if kind.wraps else None
    if kind.wraps and (inner_kind is None or inner_kind.wraps):
        raise LoraFileError(f"{display_name}: {next(roles[p] for p in roles if p in kind.parts)!r} ({kind.name}) "
                            f"has no weight delta of module {module!r} to apply to (lora_down/lora_up, LoHa or "
                            f"LoKr factors)")
    own = kind.parts | (inner_kind.parts if inner_kind else frozenset()) | {"alpha"}
    every_delta_part = delta_parts()
    foreign = [raw for role, raw in roles.items() if role in every_delta_part and role not in own]
    if foreign:
        raise LoraFileError(f"{display_name}: module {module!r} mixes {kind.name} tensors with {foreign[0]!r} "
                            f"of another adapter kind")
    if inner_kind is None:
        return kind.build(module, {r: k for r, k in roles.items() if r in own}, tensors, display_name, peft)
    inner_parts = inner_kind.parts | {"alpha"}
    inner = inner_kind.build(module, {r: k for r, k in roles.items() if r in inner_parts}, tensors, display_name,
                             peft)
    return kind.build(module, {r: k for r, k in roles.items() if r in kind.parts}, tensors, display_name, peft,
                      inner=inner)


def unfused_kinds() -> tuple:
    """Names of the kinds a dynamic (peft) adapter can run unfused (``AdapterKind.peft_capable``)."""
    return tuple(k.name for k in _kinds if k.peft_capable)


def fused_only_kinds() -> tuple:
    """Names of the kinds that must be fused: every other kind, and the full diffs."""
    return tuple(k.name for k in _kinds if not k.peft_capable) + (full_diff.KIND.name,)


def by_name(name: str) -> AdapterKind:
    for kind in _kinds:
        if kind.name == name:
            return kind
    raise KeyError(name)


__all__ = ["AdapterKind", "FullDiff", "WeightDelta", "all_kinds", "build_delta", "build_full_diffs", "by_name",
           "delta_parts", "full_diff_suffix_parts", "fused_only_kinds", "kind_for", "register", "suffix_parts",
           "unfused_kinds", "unregister"]
