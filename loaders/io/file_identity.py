"""The identity of a file or folder on disk: what every cache keyed by "the same file, unchanged" compares.

Why one definition: the LoRA reader's cache, the PEFT adapter cache and the editor's contract lookups each kept
their own (size + mtime here, device + inode there, a folder's files or all of its entries), so the same edit to
an adapter folder could refresh one cache and not another. Symlinks are followed, as the readers do.
"""

from __future__ import annotations

import itertools
import os

MAX_FOLDER_ENTRIES = 64  # a model or adapter folder has a dozen; a huge folder is keyed by its own stat only


def _stamp(stat: os.stat_result) -> tuple:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def file_identity(path: str) -> tuple:
    """``(device, inode, size, mtime_ns)`` of ``path``; for a folder, also each direct entry's, by name: what
    changes when the file, or any file directly in the folder, is replaced, rewritten, added or removed."""
    own = _stamp(os.stat(path))
    if not os.path.isdir(path):
        return own
    with os.scandir(path) as entries:
        names = sorted(entry.name for entry in itertools.islice(entries, MAX_FOLDER_ENTRIES + 1))
    if len(names) > MAX_FOLDER_ENTRIES:
        return own
    return own, tuple((name, _stamp(os.stat(os.path.join(path, name)))) for name in names)
