"""The identity of a file or folder on disk: what every cache keyed by "the same file, unchanged" compares.

Why one definition: the LoRA reader's cache, the PEFT adapter cache and the editor's contract lookups each kept
their own (size + mtime here, device + inode there, a folder's files or all of its entries), so the same edit to
an adapter folder could refresh one cache and not another. Symlinks are followed, as the readers do. The ctime is
part of it: a rewrite that restores the size and sets the mtime back still moves the ctime, which no user call can
set back.
"""

from __future__ import annotations

import itertools
import os
import stat
import threading
from collections import OrderedDict

MAX_FOLDER_ENTRIES = 64  # a model or adapter folder has a dozen; a huge folder is keyed by its own stat only


def stat_identity(stat: os.stat_result) -> tuple:
    """``(device, inode, size, mtime_ns, ctime_ns)`` of one ``os.stat`` (or ``os.fstat``) result."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def file_identity(path: str) -> tuple:
    """``stat_identity`` of ``path``; for a folder, also each direct entry's, by name: what
    changes when the file, or any file directly in the folder, is replaced, rewritten, added or removed."""
    own = stat_identity(os.stat(path))
    if not os.path.isdir(path):
        return own
    names = _entry_names(path)
    if len(names) > MAX_FOLDER_ENTRIES:
        return own
    return own, tuple((name, _entry_identity(os.path.join(path, name))) for name in names)


def model_folder_identity(path: str) -> tuple:
    """The identity of a model folder, of every entry in it and of every entry of each folder in it (a diffusers
    folder's components; hidden folders skipped): what changes when any file of the model is replaced, rewritten,
    added or removed. What the model store keys a loaded folder by, and the loader node's ``IS_CHANGED`` (asked for
    every prompt: one ``stat`` per entry and one listing per folder, nothing stated twice)."""
    found = os.stat(path)
    if not stat.S_ISDIR(found.st_mode):
        return stat_identity(found)
    return stat_identity(found), _listing(path, depth=1)


def _listing(path: str, depth: int) -> tuple | None:
    """``(name, identity, listing of it when a folder and depth is left)`` per entry; None past
    ``MAX_FOLDER_ENTRIES`` (the folder is then keyed by its own stat only)."""
    names = _entry_names(path)
    if len(names) > MAX_FOLDER_ENTRIES:
        return None
    entries = []
    for name in names:
        full = os.path.join(path, name)
        try:
            found = os.stat(full)
        except OSError:  # a dangling link: not an error of the folder's
            entries.append((name, None, ()))
            continue
        inner = _listing(full, depth - 1) if depth and stat.S_ISDIR(found.st_mode) and name[:1] != "." else ()
        entries.append((name, stat_identity(found), inner))
    return tuple(entries)


def _entry_names(path: str) -> list:
    with os.scandir(path) as entries:
        return sorted(entry.name for entry in itertools.islice(entries, MAX_FOLDER_ENTRIES + 1))


def _entry_identity(path: str):
    """An entry's ``stat_identity``; None for one that cannot be stated (a dangling link), which is not an error
    of the folder's."""
    try:
        return stat_identity(os.stat(path))
    except OSError:
        return None


class LatestVersionCache:
    """``path -> value`` for the latest version of each path only, bounded to ``max_paths`` paths (the least
    recently asked dropped first). Why: a cache keyed by (path, version) keeps every old version of a rewritten
    file and every path a long-running server was ever asked about; this one stays as small as what is in use."""

    def __init__(self, max_paths: int):
        self.max_paths = max_paths
        self._items: "OrderedDict[str, tuple]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, version: tuple):
        """The value remembered for ``path`` at ``version``, else None."""
        with self._lock:
            item = self._items.get(path)
            if item is None or item[0] != version:
                return None
            self._items.move_to_end(path)
            return item[1]

    def put(self, path: str, version: tuple, value) -> None:
        with self._lock:
            self._items[path] = (version, value)
            self._items.move_to_end(path)
            while len(self._items) > self.max_paths:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
