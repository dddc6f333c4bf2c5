"""The binding fingerprint of a prompt: which model, with which LoRAs fused at which strengths.

Why from node definitions instead of class names: a node whose output is a model handle (``LORABIND_MODEL``)
is exactly a node that decides what the sampler binds — the loader, a distill fuse, a MoE pair, a PEFT
adapter or schedule attached to the model. Their literal inputs (file names, strengths, dtype…) describe the
binding; node ids and wiring order do not, so the same workflow from two clients gets the same fingerprint.

Only the part a replica must hold fused counts: a node whose LoRA files are all plain low-rank pairs (a user's
style LoRA) runs on the prompt's own rows of a batch (``loaders.batching``), over whatever the replica holds, so it
is left out. Mixed-LoRA prompts over one distill pair therefore reach the replica that holds the pair.
"""

from __future__ import annotations

import hashlib
import json

from ...loaders.batching.bindings import file_runs_per_row
from ...loaders.errors import LoraBindError
from ...loaders.lora import read_lora
from ...usecases.vocabulary import SOCKET_MODEL
from .. import folder_paths


def _is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


def _runs_per_row(literals: dict) -> bool:
    """A node whose literals name LoRA files, each of them plain low-rank pairs (unreadable: it counts)."""
    files = [path for path in (folder_paths.get_full_path("loras", value) for value in literals.values()
                               if isinstance(value, str) and value) if path is not None]
    try:
        return bool(files) and all(file_runs_per_row(read_lora(path)) for path in files)
    except LoraBindError:  # the replica's sampler names the file; routing just keeps it in the fingerprint
        return False


def binding_fingerprint(prompt: dict, node_classes: dict) -> str:
    """A short stable id of what ``prompt`` binds, or "" when no node in it produces a model handle."""
    parts = []
    for node in prompt.values():
        node_class = node_classes.get(node.get("class_type"))
        if node_class is None or SOCKET_MODEL not in tuple(getattr(node_class, "RETURN_TYPES", ())):
            continue
        literals = {name: value for name, value in (node.get("inputs") or {}).items() if not _is_link(value)}
        if _runs_per_row(literals):
            continue
        parts.append([node["class_type"], literals])
    if not parts:
        return ""
    canonical = json.dumps(sorted(parts, key=lambda p: json.dumps(p, sort_keys=True, default=str)),
                           sort_keys=True, default=str)
    return "bind-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]
