"""What the tests look at inside the engine and no engine caller needs: the hooks of ours on a
module tree, GGUF patch lists, active adapters, RAM backup bytes, load counts, and a WAV's embedded comment.

Why here and not in the engine: each reads state the engine keeps for its own work; a public function that only
tests call is code the engine would have to keep without a use (issue 41's rot list).
"""

from __future__ import annotations

import struct
from pathlib import Path

from lorabind.loaders import forward_hooks
from lorabind.loaders.io import json_limits
from lorabind.loaders.models import store


def hooks_of_ours(root) -> list:
    """``(qualified module name, module, hook name)`` for every lorabind hook under ``root`` (itself included)."""
    found = []
    for module_name, module in root.named_modules():
        registry = getattr(module, forward_hooks._REGISTRY_ATTRIBUTE, None)
        names = list(registry.hooks) if registry is not None else []
        found += [(module_name, module, name) for name in names if name.startswith(forward_hooks.PREFIX)]
    return found


def detach_all(root) -> int:
    """Remove every hook of ours under ``root`` through the one hook system; returns how many there were."""
    found = hooks_of_ours(root)
    for _, module, name in found:
        forward_hooks.detach(module, name)
    return len(found)


def gguf_patches_of(module) -> dict:
    """``{parameter name: DequantPatch}`` of a GGUF layer (empty when none is patched)."""
    state = forward_hooks.state_of(module, forward_hooks.GGUF_PATCHES)
    return dict(state.patches) if state is not None else {}


def active_adapters(cache) -> list:
    """Labels, components and scales of the adapters active in a model's adapter cache."""
    if cache is None:
        return []
    return [{"name": cache.entries[key].label, "component": key[2], "scale": scale}
            for key, scale in cache.active.items()]


def backup_bytes(patcher) -> int:
    """Host bytes the patcher holds as RAM copies of originals (file-backed originals hold only a checksum)."""
    return sum(entry["ram_bytes"] for entry in patcher.restore_sources().values())


def load_count(path) -> int:
    """How many times the store really loaded ``path`` from disk (cache misses)."""
    return store._load_counts.get(str(Path(path).expanduser().resolve()), 0)


def read_wav_comment(path: str) -> dict | None:
    """The JSON object in a WAV's ``LIST/INFO/ICMT`` chunk (where our writer puts the workflow), or None."""
    blob = Path(path).read_bytes()
    pos = 12
    while pos + 8 <= len(blob):
        tag, size = blob[pos:pos + 4], struct.unpack("<I", blob[pos + 4:pos + 8])[0]
        payload = blob[pos + 8:pos + 8 + size]
        if tag == b"LIST" and payload[:4] == b"INFO" and payload[4:8] == b"ICMT":
            text_size = struct.unpack("<I", payload[8:12])[0]
            return json_limits.loads(payload[12:12 + text_size].rstrip(b"\x00").decode("utf-8"))
        pos += 8 + size + (size % 2)
    return None
