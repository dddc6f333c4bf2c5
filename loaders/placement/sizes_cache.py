"""Component sizes kept on disk between runs, one entry per config, dtype, storage and library version.

Why: ``lorabind plan`` builds each component on the meta device to size it (``sizes``), which takes seconds of
Python per 14B model, plus importing torch, diffusers and transformers; a plan that tries every storage of three
models took a minute on a loaded machine. The sizes follow from the config alone, so a config sized once is
answered from this file afterwards, without importing torch. The key holds everything the answer depends on: the
config text, the class, the dtype, how the weights are stored, the installed version of the library that builds
the class (and of gguf, whose block sizes GGUF storage uses) and ``CACHE_FORMAT`` (bump it when ``sizes``
measures differently). Where: ``$LORABIND_CACHE_DIR``, else ``$XDG_CACHE_HOME/lorabind``, else
``~/.cache/lorabind`` (never a model folder).

The file is a cache, so nothing in it is trusted (issues 52 and 61: a FIFO in its place hung ``plan``; an edited
entry made a 14B model "fit" in 7.9 GiB; a padded one, 2,000 components long, cost minutes of planning):

* it is opened as a regular file and read within ``MAX_CACHE_BYTES``, parsed once per file version, and used
  only when it parses as ours (an object of entries, no key twice) and is this user's own file, writable by no
  one else; otherwise it is ignored, and replaced by the next write;
* every entry carries an HMAC of its key and value under a secret of this user's (``KEY_NAME``, mode 0600, made
  on first use): the key is a hash of the source configuration, so an entry verifies only when it was written by
  this code for that configuration. An entry edited by hand, copied from another machine or written by anything
  that cannot read the secret does not verify and is measured again;
* a model's entry must name distinct components of its ``model_index.json``, at most ``MAX_COMPONENTS``.
Whoever can read this user's files can still forge entries: that is the user's own account, not an attack on it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import threading
from importlib import metadata
from pathlib import Path
from typing import Callable

from ..io import json_limits
from ..io.atomic_files import write_atomically
from ..io.file_identity import stat_identity
from ..io.regular_files import FileTooLargeError, open_regular, read_bounded

CACHE_FORMAT = 2  # 2: entries carry their HMAC (``_sealed``)
CACHE_NAME = "component-sizes.json"
KEY_NAME = "component-sizes.key"
MAX_CACHE_BYTES = 4 << 20  # ~4000 model entries; a larger file is not ours to parse
MAX_CONFIG_BYTES = 1 << 20  # a component's config.json is a few kilobytes
MAX_ENTRIES = 2048  # the oldest entries go first beyond this
MAX_COMPONENTS = 16  # a model's entry (the real ones have 3 to 7)
SIZE_FIELDS = ("bytes", "largest_layer_bytes", "largest_block_bytes", "blocks_bytes", "parameters")
_KEY_BYTES = 32
_parsed: dict = {}  # cache path -> (file identity, entries): the file is parsed once per version
_lock = threading.Lock()


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
    hit = _lookup(key)
    if _valid(hit):
        return {name: hit[name] for name in SIZE_FIELDS}
    sizes = measure()
    _store(key, {name: int(sizes[name]) for name in SIZE_FIELDS})
    return sizes


def read_config_text(path: Path) -> str:
    """A ``config.json``'s text, read as a regular file within ``MAX_CONFIG_BYTES`` (``OSError`` /
    ``UnicodeDecodeError`` otherwise): a FIFO or a padded file in a model folder cannot stall ``plan``."""
    return read_bounded(path, MAX_CONFIG_BYTES).decode("utf-8")


def model_key(folder: Path, dtype_name: str, weights: str) -> tuple[str, frozenset] | None:
    """``(key, component names)`` of a whole model's sizes: the key holds its ``model_index.json`` and every
    component's ``config.json`` as they are on disk, with the versions of the libraries that build them; None
    when one cannot be read (the slow path then says why)."""
    try:
        index_text = read_bounded(folder / "model_index.json", MAX_CONFIG_BYTES).decode("utf-8")
        index = json_limits.loads(index_text)
        configs = {name: read_config_text(folder / name / "config.json")
                   for name in sorted(index) if (folder / name / "config.json").is_file()}
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(index, dict):
        return None
    libraries = sorted({str(entry[0]) for entry in index.values() if isinstance(entry, list) and entry and entry[0]})
    versions = [_version(library) for library in libraries] + [_version("gguf")]
    text = json.dumps([CACHE_FORMAT, "model", str(folder.resolve()), index_text, configs, versions, dtype_name,
                       weights])
    return hashlib.sha256(text.encode("utf-8")).hexdigest(), frozenset(index)


def cached_components(key: tuple[str, frozenset] | None, measure: Callable[[], list],
                      current_key: Callable[[], tuple | None] = lambda: None) -> list[dict]:
    """A whole model's component sizes ({name, role, file_backed, sizes...} each) stored under ``key`` (from
    ``model_key``), or ``measure()``'s, stored: a hit needs no model family and no torch (``lorabind plan``
    answers in well under 2 s). A hit must name distinct components of the model's index. ``measure`` reads the
    configs again, so what it measured is stored only when ``current_key()`` still gives ``key``: a config
    changed in between must not have its sizes kept under the old text's key."""
    hit = _lookup(key[0]) if key else None
    if _valid_components(hit, key[1] if key else frozenset()):
        return hit
    components = measure()
    if key and current_key() == key:
        _store(key[0], components)
    return components


def _valid(entry) -> bool:
    return isinstance(entry, dict) and all(type(entry.get(name)) is int and entry[name] >= 0 for name in SIZE_FIELDS)


def _valid_components(hit, index_names: frozenset) -> bool:
    if not isinstance(hit, list) or not 0 < len(hit) <= MAX_COMPONENTS:
        return False
    if not all(_valid(c) and isinstance(c.get("name"), str) and isinstance(c.get("role"), str)
               and isinstance(c.get("file_backed"), bool) for c in hit):
        return False
    names = [c["name"] for c in hit]
    return len(set(names)) == len(names) and set(names) <= index_names


def _lookup(key: str):
    """The value stored under ``key`` when its seal verifies, else None."""
    secret = _secret(create=False)
    entry = _read().get(key) if secret else None
    if not isinstance(entry, dict) or not isinstance(entry.get("seal"), str):
        return None
    value = entry.get("value")
    return value if hmac.compare_digest(entry["seal"], _seal(secret, key, value)) else None


def _store(key: str, value) -> None:
    secret = _secret(create=True)
    if secret is None:
        return  # no private place for the secret: the sizes are measured again next time, nothing else changes
    entries = dict(_read())
    entries.pop(key, None)
    entries[key] = {"seal": _seal(secret, key, value), "value": value}
    _write(dict(list(entries.items())[-MAX_ENTRIES:]))


def _seal(secret: bytes, key: str, value) -> str:
    text = json.dumps([key, value], sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, text.encode("utf-8"), hashlib.sha256).hexdigest()


def _own_private(found: os.stat_result) -> bool:
    """A regular file of this user's that no one else may write (where the system has users)."""
    if not stat.S_ISREG(found.st_mode) or found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    return not hasattr(os, "geteuid") or found.st_uid == os.geteuid()


def _secret(create: bool) -> bytes | None:
    """This user's cache secret (``KEY_NAME`` beside the cache, readable by this user only), made when missing
    and ``create``; None when there is none or it is not private."""
    path = cache_path().with_name(KEY_NAME)
    try:
        with open_regular(path) as handle:
            found = os.fstat(handle.fileno())
            secret = handle.read(_KEY_BYTES + 1)
        private = _own_private(found) and not found.st_mode & (stat.S_IRGRP | stat.S_IROTH)
        return secret if private and len(secret) == _KEY_BYTES else None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    if not create:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return _secret(create=False)  # another process made it first
    except OSError:
        return None
    with os.fdopen(fd, "wb") as handle:
        handle.write(os.urandom(_KEY_BYTES))
    return _secret(create=False)


def _read() -> dict:
    """The file's entries, parsed once per file version; {} for a file that is not ours (module docstring)."""
    path = cache_path()
    try:
        with open_regular(path) as handle:
            found = os.fstat(handle.fileno())
            with _lock:
                known = _parsed.get(str(path))
            if known is not None and known[0] == stat_identity(found):
                return known[1]
            raw = handle.read(MAX_CACHE_BYTES + 1)
        if len(raw) > MAX_CACHE_BYTES:
            raise FileTooLargeError(CACHE_NAME)
        data = json_limits.loads(raw, object_pairs_hook=_no_duplicate_keys) if _own_private(found) else None
    except (OSError, ValueError):
        return {}
    entries = data if isinstance(data, dict) else {}
    with _lock:
        _parsed[str(path)] = (stat_identity(found), entries)
    return entries


def _no_duplicate_keys(pairs: list) -> dict:
    """``object_pairs_hook``: a key listed twice is not a file we wrote (``json.dumps`` of a dict never does)."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key is listed twice")
    return dict(pairs)


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
