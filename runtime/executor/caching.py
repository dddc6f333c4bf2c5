"""Signature-keyed output cache and per-(node_id, class_type) node instances, as ComfyUI's CLASSIC cache.

Why signatures and not values: values flowing on edges are arbitrary handles (models, tensors) that must never
be hashed or compared. A node's key is its own signature plus its ancestors' signatures (class, IS_CHANGED
value, constant inputs, and the position of each linked ancestor), so identical sub-graphs under different
node ids share outputs, and changing one constant invalidates exactly the nodes downstream of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .definitions import NodeDefinitions
from .graph import linked_inputs


class Unhashable:
    """Marks a value that cannot be part of a key; a key containing one is dropped (the node never hits)."""


def to_hashable(value: Any) -> Any:
    """A hashable, order-aware image of a constant; NaN and non-primitive objects become ``Unhashable()``.

    NaN gets special care: ``math.nan`` is a singleton and tuples compare items by identity first, so a NaN
    IS_CHANGED value would otherwise hit the cache although ComfyUI's intent is "always re-execute".
    """
    if isinstance(value, float) and math.isnan(value):
        return Unhashable()
    if value is None or isinstance(value, (int, float, str, bool, bytes)):
        return value
    if isinstance(value, dict):
        return frozenset((to_hashable(k), to_hashable(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(to_hashable(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(to_hashable(item) for item in value)
    return Unhashable()


def _contains_unhashable(key: Any) -> bool:
    if isinstance(key, Unhashable):
        return True
    if isinstance(key, (tuple, frozenset)):
        return any(_contains_unhashable(item) for item in key)
    return False


def node_signatures(prompt: dict, definitions: NodeDefinitions, is_changed: dict[str, Any]) -> dict[str, Any]:
    """Cache key of every node in ``prompt``; None for nodes that must never be served from cache.

    Key = own signature followed by each ancestor's, in a deterministic upstream order; links are written as
    ("ANCESTOR", position of the upstream node in that order, slot), so node ids stay out of the key. Each node's
    links and constant part are worked out once per prompt, not once per descendant that repeats them (this
    runs before every prompt, cached reruns included).
    """
    links = {node_id: linked_inputs(node) for node_id, node in prompt.items()}
    own = {node_id: _own_signature(prompt, definitions, is_changed, node_id, links[node_id]) for node_id in prompt}
    keys: dict[str, Any] = {}
    for node_id in prompt:
        ancestors = _ordered_ancestry(prompt, links, node_id)
        members = [node_id, *ancestors]
        if any(own[member].unhashable for member in members):
            keys[node_id] = None
            continue
        positions = {ancestor: i for i, ancestor in enumerate(ancestors)}
        keys[node_id] = tuple(own[member].placed(positions) for member in members)
    return keys


def _ordered_ancestry(prompt: dict, links: dict, node_id: str) -> list[str]:
    """Upstream node ids in depth-first order over sorted input names (ComfyUI's get_ordered_ancestry);
    ``links``: every node's ``linked_inputs``."""
    order: list[str] = []
    seen: set[str] = {node_id}
    stack = [iter(links[node_id])]
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            continue
        upstream = step[1]
        if upstream in seen or upstream not in prompt:
            continue
        seen.add(upstream)
        order.append(upstream)
        stack.append(iter(links[upstream]))
    return order


@dataclass(frozen=True)
class _OwnSignature:
    """A node's signature before its links are written as ancestor positions: ``head`` is ``(class_type,
    is_changed[, node_id])``; ``inputs`` are sorted ``(name, constant)`` pairs and ``(name, _Link)`` ones."""

    head: tuple
    inputs: tuple
    unhashable: bool

    def placed(self, positions: dict) -> tuple:
        """``(*head, sorted (input, constant | ("ANCESTOR", position, slot)))`` for one keyed node's ancestry."""
        inputs = tuple((name, ("ANCESTOR", positions.get(value.from_id, -1), value.slot))
                       if isinstance(value, _Link) else (name, value) for name, value in self.inputs)
        return (*self.head, inputs)


@dataclass(frozen=True)
class _Link:
    from_id: str
    slot: int


def _own_signature(prompt, definitions, is_changed, node_id, links: list) -> _OwnSignature:
    node = prompt[node_id]
    class_type = node["class_type"]
    head = [class_type, to_hashable(is_changed.get(node_id, False))]
    if definitions.keys_on_node_id(class_type):
        head.append(node_id)
    linked = {name: _Link(from_id, slot) for name, from_id, slot in links}
    inputs = tuple((name, linked[name] if name in linked else to_hashable(value))
                   for name, value in sorted((node.get("inputs") or {}).items()))
    constants = tuple(value for _, value in inputs if not isinstance(value, _Link))
    return _OwnSignature(tuple(head), inputs, _contains_unhashable((*head, constants)))


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

    def retain_only(self, keys) -> None:
        """CLASSIC mode: keep only the entries the current prompt can use."""
        wanted = {key for key in keys if key is not None}
        self._entries = {key: entry for key, entry in self._entries.items() if key in wanted}

    def get(self, key) -> CacheEntry | None:
        if key is None or not self.enabled:
            return None
        return self._entries.get(key)

    def put(self, key, entry: CacheEntry) -> None:
        if key is not None and self.enabled:
            self._entries[key] = entry

    def clear(self) -> None:
        self._entries.clear()

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
