"""Where a model file a workflow names comes from, for ``lorabind models check``'s MISSING lines.

Why: a missing file's line said only where it was looked for; a new user still had to find which release it
belongs to. The names lorabind knows are the published ones of its shipped configurations (each one's
``files.json``, the table of docs/model-files/real-models.md), so a missing file is traced to the configuration
that lists it, with the file's download address when the table gives one (a ``sources`` entry), else the page.
"""

from __future__ import annotations

import functools
import json
import re

from ..loaders.families import real_config_names
from ..loaders.io import json_limits
from ..loaders.io.shipped_configs import shipped_model_folder
from . import host

REAL_MODELS_PAGE = "docs/model-files/real-models.md"
QUANT = "{QUANT}"  # a GGUF file name's quantization in the table (Q8_0, Q4_K_M, ...)


def source_of(kind: str, name: str) -> str:
    """"https://…" or "published for wan2.2-t2v-a14b (docs/model-files/real-models.md)" for a file of folder
    kind ``kind`` named ``name`` (relative to that folder); a name no shipped configuration lists gets the
    page too, saying so."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    for config, files, sources in _published():
        for published in files:
            folder, _, file_name = published.partition("/")
            if folder == kind and _matches(file_name, base):
                url = sources.get(published)
                return (url.replace(QUANT, _quant_of(file_name, base)) if url
                        else f"published for {config} ({REAL_MODELS_PAGE})")
    if kind == "loras" and base in _published_loras():
        return f"a published distill LoRA ({REAL_MODELS_PAGE} names its repository)"
    return f"not a published file lorabind lists; the real models it runs: {REAL_MODELS_PAGE}"


def _published_loras() -> frozenset:
    """The distill LoRAs' published names: the built-in fixture LoRAs carry them (``lorabind-tiny/<name>``)."""
    factory = host.builtin_models()
    names = factory.fixture_lora_names() if factory is not None else ()
    return frozenset(name.rsplit("/", 1)[-1] for name in names)


def _matches(pattern: str, base: str) -> bool:
    if QUANT not in pattern:
        return pattern == base
    return re.fullmatch(re.escape(pattern).replace(re.escape(QUANT), r"[A-Za-z0-9_]+"), base) is not None


def _quant_of(pattern: str, base: str) -> str:
    head, _, tail = pattern.partition(QUANT)
    return base[len(head):len(base) - len(tail)] if QUANT in pattern else ""


@functools.lru_cache(maxsize=1)
def _published() -> tuple:
    """((configuration, (folder/name, ...), {folder/name: url}), ...) of every shipped ``files.json``."""
    found = []
    for config in real_config_names():
        folder = shipped_model_folder(config)
        try:
            table = json_limits.loads((folder / "files.json").read_text(encoding="utf-8")) if folder else None
        except (OSError, json.JSONDecodeError):
            table = None
        if not isinstance(table, dict):
            continue
        files = tuple(name for entry in table.values() if isinstance(entry, dict)
                      for name in entry.values() if isinstance(name, str) and "/" in name)
        sources = table.get("sources") if isinstance(table.get("sources"), dict) else {}
        found.append((config, files, sources))
    return tuple(found)
