"""Opening a file that a user, a download or another program put in place: regular files only, read within a
byte budget.

Why: ``open()`` of a FIFO waits for a writer that never comes (``models check``, ``Generator`` and ``plan`` hung on
one), and ``read()`` of a link to ``/dev/zero`` or of a sparse multi-gigabyte "config" reads until memory runs out
(a model index linked to ``/dev/zero`` passed 7 GB, then raised ``MemoryError``). Here the file is opened without
blocking (``O_NONBLOCK``: a FIFO opens at once instead of waiting), checked on the open descriptor to be a regular
file (so what is checked is what is read: a file swapped after a ``stat`` cannot slip through), and read up to a
budget the caller states. The errors are ``OSError``s, so every existing "cannot be read" handler words them.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

# what a special file is called in messages, by its st_mode test
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


class NotRegularFileError(OSError):
    """The path names a FIFO, a device, a socket or a folder where a file is read."""


class FileTooLargeError(OSError):
    """The file holds more bytes than its reader's budget."""


def kind_of(mode: int) -> str:
    """"a FIFO", "a character device", ... for a ``st_mode`` that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path) -> BinaryIO:
    """``path`` opened for binary reading; ``NotRegularFileError`` (without blocking) unless it is a regular file
    (links are followed, as ``open`` does)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{os.path.basename(os.fspath(path))} is {kind_of(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path, max_bytes: int) -> bytes:
    """All of a regular file's bytes, or ``FileTooLargeError`` when it holds more than ``max_bytes`` (at most
    ``max_bytes + 1`` are ever read, whatever the file says its size is)."""
    with open_regular(path) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(f"{os.path.basename(os.fspath(path))} holds more than {max_bytes} bytes, more "
                                "than a file of its kind may")
    return data


def require_regular(path) -> os.stat_result:
    """The ``os.stat`` of ``path`` when it is a regular file, else ``NotRegularFileError``: for a file a library
    opens itself, checked before it is handed over."""
    found = os.stat(path)
    if not stat.S_ISREG(found.st_mode):
        raise NotRegularFileError(f"{os.path.basename(os.fspath(path))} is {kind_of(found.st_mode)}, not a regular file")
    return found


# files that diffusers and transformers read whole (configs, tokenizers): the largest real one, a tokenizer.json,
# is about 11 MB; weights are read by offset and may be any size
MAX_READ_WHOLE_BYTES = 64 << 20
READ_WHOLE_SUFFIXES = (".json", ".txt", ".model")
MAX_FOLDER_ENTRIES = 4096  # a component folder holds a dozen files, a sharded one a hundred


def check_model_folder(folder, components) -> None:
    """Before a library opens anything in a model folder: every entry of ``folder`` and of its ``components``
    subfolders is a regular file or a folder (links followed; a dangling link is left to the reader, which fails on
    it at once), and each file read whole is within ``MAX_READ_WHOLE_BYTES``. ``NotRegularFileError`` /
    ``FileTooLargeError`` name the entry relative to ``folder`` ("vae/config.json")."""
    for sub in ("", *components):
        where = os.path.join(os.fspath(folder), sub) if sub else os.fspath(folder)
        if not os.path.isdir(where):
            continue
        with os.scandir(where) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_FOLDER_ENTRIES:
                    raise FileTooLargeError(f"{sub or '.'} holds more than {MAX_FOLDER_ENTRIES} entries")
                _check_entry(entry, f"{sub}/{entry.name}" if sub else entry.name)


def _check_entry(entry: os.DirEntry, relative: str) -> None:
    try:
        found = entry.stat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(found.st_mode):
        return
    if not stat.S_ISREG(found.st_mode):
        raise NotRegularFileError(f"{relative} is {kind_of(found.st_mode)}, not a regular file")
    if entry.name.endswith(READ_WHOLE_SUFFIXES) and found.st_size > MAX_READ_WHOLE_BYTES:
        raise FileTooLargeError(f"{relative} holds {found.st_size} bytes, more than the {MAX_READ_WHOLE_BYTES} a "
                                "file read whole may")
