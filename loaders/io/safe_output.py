"""One rule for every path a command writes (``merge``, ``extract``, ``models build-tiny``; user data may adopt it).

Why one rule: each writer used to check its output its own way, and each had a hole: ``merge --overwrite``
deleted whatever sat at ``--out`` (a FIFO, a user's folder, the current folder with ``--out .``), ``extract``
replaced any file without asking (the base model's weights included), and a merge into a symlink that led back
inside the source copied the source into itself. The rule, in the order it is checked:

1. a symlink at the target itself is refused (replacing it would replace the link, not what it points to);
2. a target inside any input, or holding one, is refused after resolving symlinks on both sides;
3. devices, FIFOs and sockets are refused;
4. what exists at the target is replaced only when it carries our marker (the tool's own previous output) and
   ``overwrite`` is set; an empty folder may take a folder output; anything else is refused, ``overwrite`` or not;
5. the output is written into a temporary folder beside the target and renamed into place at the end, so a
   failure (a full disk, an error half-way) leaves the target as it was and no temporary behind.

Markers: a folder carries a ``.lorabind-output`` file; a ``.safetensors`` file carries the ``lorabind_output``
metadata key (``output_metadata``). Outputs lorabind wrote before markers existed are recognised by what it
already put in them: keys of its own in a folder's ``model_index.json`` (merged models, built-in tiny models),
``format: lorabind-extract`` in an extracted file's metadata.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import struct
import tempfile

from ..errors import LoraBindError
from .atomic_files import FILE_MODE
from .regular_files import open_regular

MARKER_FILE = ".lorabind-output"
MARKER_KEY = "lorabind_output"
LEGACY_INDEX_KEYS = ("_lorabind", "_lorabind_built_with")  # model_index.json keys only lorabind writes
LEGACY_FILE_FORMATS = ("lorabind-extract",)  # the "format" metadata of files lorabind wrote before the marker
KINDS = ("folder", "file")
_MAX_MARKER_HEADER = 64 * 1024 * 1024  # reading a target's safetensors header to look for the marker


class OutputRefusedError(LoraBindError):
    """An output path the rule above refuses; the message names the path and what to do instead."""


def output_metadata(written_by: str) -> dict:
    """The safetensors metadata entry that marks a file as ``written_by``'s output."""
    return {MARKER_KEY: written_by}


def check_output(path: str, *, kind: str = "folder", inputs=(), overwrite: bool = False, label: str = "--out") -> str:
    """The absolute target path when ``path`` may be written (rules 1-4 above), else ``OutputRefusedError``.
    Call it before any expensive work; ``safe_output`` checks again right before it writes."""
    if kind not in KINDS:
        raise ValueError(f"output kind must be one of {KINDS}, got {kind!r}")
    absolute = os.path.abspath(path)
    target = os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))
    if os.path.islink(target):
        raise OutputRefusedError(f"{label} {path} is a symlink; give the real path of the new {kind}")
    _refuse_inside_inputs(path, os.path.realpath(target), inputs, label)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise OutputRefusedError(f"{label} {path}: cannot be examined ({exc.strerror})") from None
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        raise OutputRefusedError(f"{label} {path} is a device, FIFO or socket, not a {kind}; refusing to write there")
    _check_existing(path, target, stat.S_ISDIR(info.st_mode), kind, overwrite, label)
    return target


def _refuse_inside_inputs(path: str, real_target: str, inputs, label: str) -> None:
    for item in inputs:
        real_input = os.path.realpath(item)
        if _within(real_target, real_input):
            raise OutputRefusedError(f"{label} {path} lies inside the input {item} (symlinks resolved); writing "
                                     "there would change what is being read")
        if _within(real_input, real_target):
            raise OutputRefusedError(f"{label} {path} holds the input {item}; replacing it would delete the input")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _check_existing(path, target, is_dir, kind, overwrite, label) -> None:
    if kind == "file" and is_dir:
        raise OutputRefusedError(f"{label} {path} is a folder; give a file name inside it")
    if kind == "folder" and not is_dir:
        raise OutputRefusedError(f"{label} {path} is a file, not a folder lorabind wrote; refusing to replace it")
    if is_dir and not os.listdir(target):
        return  # an empty folder may take the output
    if not is_ours(target):
        raise OutputRefusedError(f"{label} {path} already exists and is not lorabind's output (it carries no "
                                 f"{MARKER_FILE if is_dir else MARKER_KEY} marker), so lorabind never replaces it, "
                                 "not even with --overwrite: choose a new path or move it away")
    if not overwrite:
        raise OutputRefusedError(f"{label} {path} already exists (an earlier lorabind output); choose a new path "
                                 "or pass --overwrite")


def is_ours(path: str) -> bool:
    """Whether ``path`` carries the marker of a lorabind output (see the module docstring)."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, MARKER_FILE)) or _legacy_folder(path)
    metadata = _safetensors_metadata(path)
    return MARKER_KEY in metadata or metadata.get("format") in LEGACY_FILE_FORMATS


def _legacy_folder(path: str) -> bool:
    try:
        with open_regular(os.path.join(path, "model_index.json")) as handle:
            index = json.loads(handle.read(_MAX_MARKER_HEADER))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(index, dict) and any(key in index for key in LEGACY_INDEX_KEYS)


def _safetensors_metadata(path: str) -> dict:
    """A file's safetensors ``__metadata__``, or {} for anything that is not a readable safetensors file."""
    try:
        with open_regular(path) as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > _MAX_MARKER_HEADER:
                return {}
            metadata = json.loads(handle.read(length)).get("__metadata__")
    except (OSError, ValueError, RecursionError, struct.error, AttributeError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


@contextlib.contextmanager
def safe_output(path: str, *, written_by: str, kind: str = "folder", inputs=(), overwrite: bool = False,
                label: str = "--out"):
    """Yield a staging path to write the output at (a fresh empty folder, or a file name inside one), then move
    it to ``path`` (see the module docstring). A ``file`` output must carry ``output_metadata(written_by)``; a
    ``folder`` output gets its marker here."""
    target = check_output(path, kind=kind, inputs=inputs, overwrite=overwrite, label=label)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".lorabind-output-", dir=parent)
    try:
        staged = os.path.join(staging, "output" if kind == "folder" else os.path.basename(target))
        if kind == "folder":
            os.mkdir(staged)
        yield staged
        _finish(staged, kind, written_by)
        check_output(path, kind=kind, inputs=inputs, overwrite=overwrite, label=label)
        if kind == "folder" and os.path.isdir(target):
            os.replace(target, os.path.join(staging, "previous"))  # a full folder cannot be renamed over
        os.replace(staged, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _finish(staged: str, kind: str, written_by: str) -> None:
    if kind == "file":
        if not is_ours(staged):
            raise RuntimeError(f"{written_by} wrote {staged} without output_metadata(): it could never be replaced")
        os.chmod(staged, FILE_MODE)
        return
    marker = os.path.join(staged, MARKER_FILE)
    if os.path.lexists(marker):  # e.g. a symlink to the source's marker (merge --asset-mode symlink)
        os.unlink(marker)
    with open(marker, "w", encoding="utf-8") as handle:
        json.dump({"written_by": written_by}, handle)
        handle.write("\n")
