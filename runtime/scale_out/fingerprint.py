"""The binding fingerprint of a prompt: which model, with which LoRAs fused at which strengths.

Why from node definitions instead of class names: a node whose output is a model handle (``LORABIND_MODEL``)
is exactly a node that decides what the sampler binds — the loader, a distill fuse, a MoE pair, a PEFT
adapter or schedule attached to the model. Their literal inputs (file names, strengths, dtype…) describe the
binding; node ids and wiring order do not, so the same workflow from two clients gets the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json

from ...usecases.vocabulary import SOCKET_MODEL


def _is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


def binding_fingerprint(prompt: dict, node_classes: dict) -> str:
    """A short stable id of what ``prompt`` binds, or "" when no node in it produces a model handle."""
    parts = []
    for node in prompt.values():
        node_class = node_classes.get(node.get("class_type"))
        if node_class is None or SOCKET_MODEL not in tuple(getattr(node_class, "RETURN_TYPES", ())):
            continue
        literals = {name: value for name, value in (node.get("inputs") or {}).items() if not _is_link(value)}
        parts.append([node["class_type"], literals])
    if not parts:
        return ""
    canonical = json.dumps(sorted(parts, key=lambda p: json.dumps(p, sort_keys=True, default=str)),
                           sort_keys=True, default=str)
    return "bind-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]
