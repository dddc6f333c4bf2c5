"""The registry of adapter kinds: adding a kind is one file in this package plus one entry in ``_BUILTIN``.

``register`` adds a kind at run time (a plug-in or a test); everything that reads, accounts, fuses or reports
LoRA files asks this registry, never a kind by name.
"""

from __future__ import annotations

from typing import Optional

from . import loha, lokr, low_rank
from .base import AdapterKind, WeightDelta

_BUILTIN = (low_rank.KIND, loha.KIND, lokr.KIND)
_kinds: list = list(_BUILTIN)


def register(kind: AdapterKind) -> None:
    """Add (or replace, by name) an adapter kind."""
    _kinds[:] = [k for k in _kinds if k.name != kind.name] + [kind]


def unregister(name: str) -> None:
    """Remove a kind added by ``register`` (built-in kinds stay)."""
    _kinds[:] = [k for k in _kinds if k.name != name or k in _BUILTIN]


def all_kinds() -> tuple:
    return tuple(_kinds)


def suffix_parts() -> tuple:
    """Every kind's ``(suffix, part)`` pairs, in registry order."""
    return tuple(pair for kind in _kinds for pair in kind.suffix_parts)


def delta_parts() -> frozenset:
    """The ``source_keys`` parts that belong to a weight delta (every kind's parts plus ``alpha``)."""
    return frozenset(part for kind in _kinds for part in kind.parts) | {"alpha"}


def kind_for(parts) -> Optional[AdapterKind]:
    """The kind whose parts a module's parts include (None: no weight delta); the first registered wins."""
    for kind in _kinds:
        if kind.parts & set(parts):
            return kind
    return None


def by_name(name: str) -> AdapterKind:
    for kind in _kinds:
        if kind.name == name:
            return kind
    raise KeyError(name)


__all__ = ["AdapterKind", "WeightDelta", "all_kinds", "by_name", "delta_parts", "kind_for", "register",
           "suffix_parts", "unregister"]
