"""Writing and renaming the user's files under quotas, with ``overwrite=false`` as a real compare-and-swap.

Why a lock around check and write: the check that a file does not exist used to run before the body arrived, so
a slow writer overwrote a file created meanwhile and still got 200. Under ``_lock`` the existence check, the
quota check and the rename happen as one step for every writer in this server (the folder is the server's own:
``<state folder>/userdata``). Why quotas: the folder is filled by requests, so its file count and total size
are bounded like every other size a request controls.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ....loaders.io.atomic_files import write_atomically

MAX_USER_FILES = 10_000  # also the most a listing returns, so a listing within the quota is never cut
MAX_USER_BYTES = 1024 * 1024 * 1024
_lock = threading.Lock()


class UserFileRefused(Exception):
    """A write or rename refused: ``status`` is the HTTP status, the message says why in the user's words."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def usage(root: Path) -> tuple[int, int]:
    """(files, bytes) under ``root``; symlinks are neither counted nor followed."""
    files = total = 0
    for current, _, names in os.walk(root):
        for name in names:
            path = os.path.join(current, name)
            if not os.path.islink(path) and os.path.isfile(path):
                files += 1
                total += os.path.getsize(path)
    return files, total


def _check_quota(root: Path, target: Path, new_bytes: int) -> None:
    files, total = usage(root)
    if target.is_file():  # replacing: the old content goes
        files, total = files - 1, total - target.stat().st_size
    if files + 1 > MAX_USER_FILES:
        raise UserFileRefused(413, f"The user folder already holds {files} files, the most it may hold; delete "
                                   "some saved workflows first.")
    if total + new_bytes > MAX_USER_BYTES:
        raise UserFileRefused(413, f"The user folder holds {total} bytes; {new_bytes} more would pass its limit of "
                                   f"{MAX_USER_BYTES} bytes. Delete some saved workflows first.")


def make_parent_folders(root: Path, target: Path, shown: str) -> None:
    """Create the folders above ``target``; 400 naming the part that is a file (no OSError with a path)."""
    folder = root
    for part in target.relative_to(root).parts[:-1]:
        folder = folder / part
        if folder.exists() and not folder.is_dir():
            raise UserFileRefused(400, f"{shown!r} cannot be created: {folder.relative_to(root).as_posix()!r} is a "
                                       "file, not a folder.")
    target.parent.mkdir(parents=True, exist_ok=True)


def write_user_file(root: Path, target: Path, body: bytes, overwrite: bool, shown: str) -> bool:
    """Write ``body`` to ``target`` atomically; False (nothing written) when it exists and not ``overwrite``."""
    with _lock:
        if target.is_dir():
            raise UserFileRefused(400, f"{shown!r} is a folder.")
        if target.exists() and not overwrite:
            return False
        _check_quota(root, target, len(body))
        make_parent_folders(root, target, shown)
        write_atomically(str(target), lambda temp: Path(temp).write_bytes(body))
    return True


def move_user_file(root: Path, source: Path, dest: Path, overwrite: bool, shown: str) -> bool:
    """Rename ``source`` to ``dest``; False (nothing moved) when ``dest`` exists and not ``overwrite``."""
    with _lock:
        if not source.is_file():
            raise UserFileRefused(404, f"no user file {source.relative_to(root).as_posix()!r}")
        if dest.is_dir():
            raise UserFileRefused(400, f"{shown!r} is a folder.")
        if dest.exists() and not overwrite:
            return False
        make_parent_folders(root, dest, shown)
        os.replace(source, dest)
    return True
