"""Component sizes kept on disk between runs, one entry per config, dtype, storage and library version.

Why: ``lorabind plan`` builds each component on the meta device to size it (``sizes``), which takes seconds of
Python per 14B model, plus importing torch, diffusers and transformers; a plan that tries every storage of three
models took a minute on a loaded machine. The sizes follow from the config alone, so a config sized once is
answered from this file afterwards, without importing torch. The key holds everything the answer depends on: the
config text, the class, the dtype, how the weights are stored, the installed version of the library that builds
the class (and of gguf, whose block sizes GGUF storage uses) and ``CACHE_FORMAT`` (bump it when ``sizes``
measures differently). The file is a cache: unreadable, damaged or unwritable, it is ignored and sizes are built.
Where: ``$LORABIND_CACHE_DIR``, else ``$XDG_CACHE_HOME/lorabind``, else ``~/.cache/lorabind`` (never a model
folder).
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Callable

from ..io import json_limits
from ..io.atomic_files import write_atomically

CACHE_FORMAT = 1
CACHE_NAME = "component-sizes.json"
MAX_CACHE_BYTES = 4 << 20  # ~20000 entries; a larger file is not ours to parse
MAX_ENTRIES = 2048  # the oldest entries go first beyond this
SIZE_FIELDS = ("bytes", "largest_layer_bytes", "largest_block_bytes", "blocks_bytes", "parameters")


def cache_path() -> Path:
    root = os.environ.get("LORABIND_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lorabind")
    return Path(root) / CACHE_NAME


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def sizes_key(library: str, class_name: str, config_text: str, dtype_name: str, weights: str) -> str:
    versions = [_version(library), _version("gguf") if weights not in ("bf16", "fp8") else ""]
    text = json.dumps([CACHE_FORMAT, library, versions, class_name, config_text, dtype_name, weights])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cached_sizes(key: str, measure: Callable[[], dict]) -> dict:
    """The sizes stored under ``key``, or ``measure()``'s, stored for the next run."""
    entries = _read()
    hit = entries.get(key)
    if _valid(hit):
        return {name: hit[name] for name in SIZE_FIELDS}
    sizes = measure()
    entries.pop(key, None)
    entries[key] = {name: int(sizes[name]) for name in SIZE_FIELDS}
    _write(dict(list(entries.items())[-MAX_ENTRIES:]))
    return sizes


def model_key(folder: Path, dtype_name: str, weights: str) -> str | None:
    """The key of a whole model's sizes: its ``model_index.json`` and every component's ``config.json`` as they
    are on disk, with the versions of the libraries that build them; None when one cannot be read (the slow path
    then says why)."""
    try:
        index_text = (folder / "model_index.json").read_text(encoding="utf-8")
        index = json_limits.loads(index_text)
        configs = {name: (folder / name / "config.json").read_text(encoding="utf-8")
                   for name in sorted(index) if (folder / name / "config.json").is_file()}
    except (OSError, ValueError):
        return None
    libraries = sorted({entry[0] for entry in index.values() if isinstance(entry, list) and entry and entry[0]})
    versions = [_version(str(library)) for library in libraries] + [_version("gguf")]
    text = json.dumps([CACHE_FORMAT, "model", str(folder.resolve()), index_text, configs, versions, dtype_name,
                       weights])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cached_components(key: str | None, measure: Callable[[], list]) -> list[dict]:
    """A whole model's component sizes ({name, role, file_backed, sizes...} each) stored under ``key``, or
    ``measure()``'s, stored: a hit needs no model family and no torch (``lorabind plan`` answers in well under
    2 s)."""
    entries = _read() if key else {}
    hit = entries.get(key)
    if isinstance(hit, list) and hit and all(_valid(c) and isinstance(c.get("name"), str)
                                             and isinstance(c.get("role"), str)
                                             and isinstance(c.get("file_backed"), bool) for c in hit):
        return hit
    components = measure()
    if key:
        entries.pop(key, None)
        entries[key] = components
        _write(dict(list(entries.items())[-MAX_ENTRIES:]))
    return components


def _valid(entry) -> bool:
    return isinstance(entry, dict) and all(type(entry.get(name)) is int and entry[name] >= 0 for name in SIZE_FIELDS)


def _read() -> dict:
    path = cache_path()
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CACHE_BYTES + 1)
        data = json_limits.loads(raw) if len(raw) <= MAX_CACHE_BYTES else None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(entries: dict) -> None:
    path = cache_path()

    def write(temp_path: str) -> None:
        with open(temp_path, "w", encoding="utf-8") as handle:
            json.dump(entries, handle)

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(str(path), write)
    except OSError:
        pass  # a read-only home: the sizes are built again next time, nothing else changes
