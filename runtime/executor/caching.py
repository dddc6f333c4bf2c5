"""Signature-keyed output cache and per-(node_id, class_type) node instances, as ComfyUI's CLASSIC cache.

Why signatures and not values: values flowing on edges are arbitrary handles (models, tensors) that must never
be hashed or compared. A node's key is its own signature (class, IS_CHANGED value, constant inputs) with each
link written as the key of the node it comes from and the slot, so identical sub-graphs under different node ids
share outputs, and changing one constant invalidates exactly the nodes downstream of it.

Why keys nest instead of listing every ancestor (ComfyUI's ancestry order with positions): each node's key is
built once from its upstream keys, where the ancestry form rebuilt every ancestor's signature for every
descendant; on a seed-only rerun of the tiny Wan workflow that was a sixth of the runtime's own work. The two
agree on every prompt except one where a node takes two links from distinct but identical upstream nodes: nested
keys then equal those of the same node taking both links from one of them, which is the same computation (the
premise of sharing outputs between identical sub-graphs; nodes that are not idempotent key on their id).

Why keys are ``CacheKey`` objects, one per distinct signature: CPython does not remember a tuple's hash, so every
dict or set operation on a nested tuple key rehashed the whole upstream tree (a tenth of the runtime's own work on a
seed-only rerun). ``node_signatures`` interns each key in a table (``OutputCache.interned``, signature -> key) and
builds keys upstream first, so a signature's links hold the upstream keys themselves: equal signatures give the very
same ``CacheKey``, which dicts and sets hash and compare by identity, in C. (A key with a hash of its own, compared
by value, cost a Python ``__hash__`` call per look-up and per link hashed, and a Python ``__eq__`` per level of
every comparison: sixty calls on a seed-only rerun of the tiny Wan workflow, each slow in the CPU caches the
denoise has just flushed.) Interning one signature costs hashing its own inputs, and upstream keys by identity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .definitions import NodeDefinitions
from .graph import linked_inputs

_PLAIN = (int, float, str, bool, bytes)
# Constants that are their own hashable image (no NaN among them): _key takes them as they are, without a call, and
# floats too once it has seen they are not NaN.
_AS_IS = frozenset({str, int, bool, type(None)})


class CacheKey:
    """A node's cache key: ``parts`` is its signature. Equal only to itself: ``node_signatures`` hands out one key
    per signature (see the module docstring), so keys are compared only with keys from the same table."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple):
        self.parts = parts

    def __repr__(self) -> str:
        return f"CacheKey{self.parts!r}"


class _Unhashable(Exception):
    """A value that cannot be part of a key; a key containing one is dropped (the node never hits)."""


def to_hashable(value: Any) -> Any:
    """A hashable, order-aware image of a constant; raises _Unhashable for NaN and non-primitive objects.

    NaN gets special care: ``math.nan`` is a singleton and tuples compare items by identity first, so a NaN
    IS_CHANGED value would otherwise hit the cache although ComfyUI's intent is "always re-execute".
    """
    if isinstance(value, float) and math.isnan(value):
        raise _Unhashable()
    if value is None or isinstance(value, _PLAIN):
        return value
    if isinstance(value, dict):
        return frozenset((to_hashable(k), to_hashable(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(to_hashable(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(to_hashable(item) for item in value)
    raise _Unhashable()


def node_signatures(prompt: dict, definitions: NodeDefinitions, is_changed: dict[str, Any],
                    interned: dict) -> dict[str, Any]:
    """Cache key of every node in ``prompt``; None for nodes that must never be served from cache (an unhashable
    value in it or upstream of it, or a dependency cycle). ``interned``: signature -> key, the table every key
    comes from and new ones are added to (``OutputCache.interned``)."""
    builder = _KeyBuilder(prompt, definitions, is_changed, interned)
    for node_id in prompt:
        builder.build(node_id)
    return builder.keys


class _KeyBuilder:
    """Keys built upstream first, each once per prompt (this runs before every prompt, cached reruns included)."""

    def __init__(self, prompt: dict, definitions: NodeDefinitions, is_changed: dict[str, Any], interned: dict):
        self.prompt = prompt
        self.definitions = definitions
        self.is_changed = is_changed
        self.interned = interned
        self.keys: dict[str, Any] = {}

    def build(self, start: str) -> None:
        """Depth-first, one upstream node pushed at a time so the stack is the path: an upstream node already on
        it closes a cycle, whose nodes get no key."""
        if start in self.keys:
            return
        stack = [start]
        links_of = {start: linked_inputs(self.prompt[start])}
        while stack:
            current = stack[-1]
            waiting = next((upstream for _, upstream, _ in links_of[current]
                            if upstream in self.prompt and upstream not in self.keys), None)
            if waiting is not None and waiting not in links_of:
                links_of[waiting] = linked_inputs(self.prompt[waiting])
                stack.append(waiting)
                continue
            on_cycle = waiting is not None
            self.keys[current] = None if on_cycle else self._key(current, links_of[current])
            stack.pop()
            del links_of[current]

    def _key(self, node_id: str, links: list) -> CacheKey | None:
        """``(class_type, IS_CHANGED value[, node id], sorted inputs)``, each link written as ``("LINK", upstream
        key, slot)`` (a link to a node absent from the prompt as ``"MISSING"``); None when a constant, the IS_CHANGED
        value or an upstream key cannot be compared."""
        node = self.prompt[node_id]
        class_type = node["class_type"]
        try:
            changed = self.is_changed.get(node_id, False)
            head = (class_type, changed if type(changed) in _AS_IS else to_hashable(changed))
            linked = {}
            for name, from_id, slot in links:
                upstream = self.keys[from_id] if from_id in self.prompt else "MISSING"
                if upstream is None:
                    return None
                linked[name] = ("LINK", upstream, slot)
            inputs = tuple([(name, linked[name] if name in linked else value if type(value) in _AS_IS
                             or (type(value) is float and value == value) else to_hashable(value))  # not NaN
                            for name, value in sorted((node.get("inputs") or {}).items())])
        except _Unhashable:
            return None
        if self.definitions.keys_on_node_id(class_type):
            head += (node_id,)
        parts = head + (inputs,)
        key = self.interned.get(parts)
        if key is None:
            key = self.interned[parts] = CacheKey(parts)
        return key


@dataclass
class CacheEntry:
    """Outputs of one node: ``outputs[slot]`` is the list of values of that slot; ``ui`` its UI dict."""

    outputs: list
    ui: dict | None = None


@dataclass
class OutputCache:
    """Outputs keyed by signature; entries of nodes absent from the current prompt are dropped per prompt."""

    enabled: bool = True
    _entries: dict = field(default_factory=dict)
    interned: dict = field(default_factory=dict)  # signature -> its one CacheKey, for node_signatures

    def retain_only(self, keys) -> None:
        """CLASSIC mode: keep only the entries the current prompt can use, and only its keys in the table (every
        entry's key is among them)."""
        wanted = {key for key in keys if key is not None}
        self._entries = {key: entry for key, entry in self._entries.items() if key in wanted}
        self.interned = {key.parts: key for key in wanted}

    def hits(self, node_ids, keys: dict) -> dict:
        """{node id: its cached entry}, in the order of ``node_ids``, of those whose key (``keys[node id]``) has one."""
        if not self.enabled:
            return {}
        entries = self._entries
        return {node_id: entries[keys[node_id]] for node_id in node_ids if keys[node_id] in entries}

    def put(self, key, entry: CacheEntry) -> None:
        if key is not None and self.enabled:
            self._entries[key] = entry

    def uis(self) -> list[dict]:
        """The UI dicts the cached entries would replay (a Ray replica keeps the files they name)."""
        return [entry.ui for entry in self._entries.values() if entry.ui]

    def clear(self) -> None:
        self._entries.clear()
        self.interned.clear()

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class InstanceCache:
    """Node objects persist per (node_id, class_type) across prompts, so nodes may memoise in ``self``."""

    _objects: dict = field(default_factory=dict)

    def get_or_create(self, node_id: str, class_type: str, cls) -> Any:
        key = (node_id, class_type)
        if key not in self._objects:
            self._objects[key] = cls()
        return self._objects[key]

    def retain_only(self, prompt: dict) -> None:
        wanted = {(node_id, node["class_type"]) for node_id, node in prompt.items()}
        self._objects = {key: obj for key, obj in self._objects.items() if key in wanted}

    def clear(self) -> None:
        self._objects.clear()
