"""Walking model folders: the one walker (with its loop guard) and the rules for names inside a models root.

Why here: the headless registry (``runtime.folder_paths``), the model loader node's list and the PEFT folders added
to ComfyUI's LoRA list all walk folders that users fill with links to other disks. A link to an ancestor
(``ln -s . loop``) makes a naive ``os.walk(followlinks=True)`` endless, and the list runs on every
``/object_info`` request, every workflow validation and every canvas refresh; one walker, used by all of them,
keeps that guard in one place. Torch-free (the CLI's fast start imports it).
"""

from __future__ import annotations

import os
import time
from stat import S_ISDIR
from typing import Iterable, Optional

PEFT_CONFIG = "adapter_config.json"
SAFETENSORS_EXTENSIONS = {".safetensors", ".sft"}
MODEL_INDEX = "model_index.json"


def walk(roots: Iterable[str], walked: Optional[list] = None):
    """``(prefix, dirs, files)`` of every folder under ``roots``; ``prefix`` is the relative name plus ``/``
    ("" at a root). Hidden folders are skipped; clearing ``dirs`` prunes. Linked folders are followed (models often
    live on another disk), each real folder once: a link to an ancestor would otherwise make the walk endless.
    ``walked`` collects ``(folder, identity)`` of every folder read (identity None: a root that is no folder),
    what ``_remembered`` checks before it reuses a listing."""
    visited: set[tuple[int, int]] = set()  # (device, inode) of each folder walked
    for root in roots:
        if not os.path.isdir(root):
            if walked is not None:
                walked.append((root, None))
            continue
        for current, dirs, files in os.walk(root, followlinks=True):
            try:
                stat = os.stat(current)
            except OSError:
                dirs[:] = []
                continue
            if (stat.st_dev, stat.st_ino) in visited:
                dirs[:] = []
                continue
            visited.add((stat.st_dev, stat.st_ino))
            if walked is not None:
                walked.append((current, (stat.st_dev, stat.st_ino, stat.st_mtime_ns)))
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            relative = os.path.relpath(current, root).replace(os.sep, "/")
            yield ("" if relative == "." else relative + "/"), dirs, files


# A listing is reused while every folder its walk read still has the same identity and modification time: adding,
# removing or renaming an entry changes its folder's mtime, and nothing else changes a listing of names. (ComfyUI's
# folder_paths keeps its file lists the same way.) Listings run on every validation, where the model loader's
# scan was a quarter of a seed-only rerun's validation. Folders modified within SETTLE_NS of the walk are not
# trusted (file systems stamp modification times coarsely: a second change in the same tick would keep the
# mtime), so a listing made just after a change is walked again next time.
SETTLE_NS = 2_000_000_000
MAX_LISTINGS = 64
_listings: dict = {}


def _identity(folder: str):
    try:
        stat = os.stat(folder)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_mtime_ns) if S_ISDIR(stat.st_mode) else None


def _unchanged(walked: tuple) -> bool:
    """Whether every folder a listing walked still has the identity it had (a loop, not all(...): a generator
    costs a Python call per folder, on every validation)."""
    for folder, identity in walked:
        if _identity(folder) != identity:
            return False
    return True


def _remembered(kind: str, roots: Iterable, argument, list_names) -> list[str]:
    """``list_names(roots, argument, walked)``, or its last result while the folders it walked are unchanged."""
    roots = tuple(map(str, roots))
    key = (kind, roots, argument)
    known = _listings.get(key)
    if known is not None and _unchanged(known[0]):
        return list(known[1])
    walked: list = []
    names = list_names(roots, argument, walked)
    now = time.time_ns()
    if all(identity is None or now - identity[2] >= SETTLE_NS for _, identity in walked):
        if len(_listings) >= MAX_LISTINGS:
            _listings.clear()
        _listings[key] = (tuple(walked), tuple(names))
    return names


def folders_holding(roots: Iterable[str], marker: str) -> list[str]:
    """Relative names of the folders under ``roots`` that hold ``marker`` (a model's ``model_index.json``, a
    PEFT adapter's ``adapter_config.json``); their own subfolders are not searched further."""
    return _remembered("holding", roots, marker, _folders_holding)


def _folders_holding(roots, marker: str, walked: list) -> list[str]:
    names = set()
    for prefix, dirs, files in walk(roots, walked):
        if marker in files and prefix:
            names.add(prefix.rstrip("/"))
            dirs[:] = []
    return sorted(names)


def files_named(roots: Iterable[str], extension: str) -> list[str]:
    """Relative names of the files under ``roots`` ending in ``extension`` (``.gguf`` denoisers: ComfyUI lists
    only its own extensions in ``diffusion_models``, so the pack walks the folders for these itself)."""
    return _remembered("ending", roots, extension, _files_named)


def _files_named(roots, extension: str, walked: list) -> list[str]:
    return sorted({prefix + file for prefix, _, files in walk(roots, walked) for file in files
                   if file.lower().endswith(extension)})


def lora_names(roots: list[str]) -> list[str]:
    """The one LoRA list, headless and inside ComfyUI: the safetensors files and PEFT adapter folders (holding
    ``adapter_config.json``) under ``roots``, as relative names. A PEFT folder is listed as itself, never its
    inner ``adapter_model.safetensors``, and pickle formats are not listed (the pack refuses them); ComfyUI's
    own ``loras`` list has both, so inside ComfyUI the pack lists with this function too."""
    return _remembered("loras", roots, None, _lora_names)


def _lora_names(roots, _argument, walked: list) -> list[str]:
    names: set[str] = set()
    for prefix, dirs, files in walk(roots, walked):
        if PEFT_CONFIG in files and prefix:
            names.add(prefix.rstrip("/"))
            dirs[:] = []
            continue
        names.update(prefix + file for file in files if os.path.splitext(file)[1].lower() in SAFETENSORS_EXTENSIONS)
    return sorted(names)


def safe_relative_name(folder_name: str, filename: str) -> str:
    """Validate a model name: a relative path with ``/`` that stays inside its root. Returns it normalised.

    Refuses absolute paths, drive letters and ``..`` components with an error naming the kind and the name.
    """
    if not isinstance(filename, str) or not filename.strip():
        raise ValueError(f"Empty model name for folder '{folder_name}'.")
    name = filename.replace("\\", "/")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or os.path.isabs(filename) or (len(name) > 1 and name[1] == ":"):
        raise ValueError(
            f"Refusing model name '{filename}' for folder '{folder_name}': it is an absolute path; names are "
            f"relative to the '{folder_name}' folder of the models root."
        )
    if ".." in parts:
        raise ValueError(
            f"Refusing model name '{filename}' for folder '{folder_name}': '..' would leave the "
            f"'{folder_name}' folder of the models root."
        )
    return "/".join(parts)


def find_peft_folder(roots: list[str], name: str) -> Optional[str]:
    """The PEFT folder ``name`` under one of ``roots`` (ComfyUI's ``get_full_path`` finds files only)."""
    relative = safe_relative_name("loras", name)
    for root in roots:
        candidate = os.path.join(root, *relative.split("/"))
        if os.path.isfile(os.path.join(candidate, PEFT_CONFIG)):
            return candidate
    return None


def model_folder_names(roots: Iterable) -> list[str]:
    """Every diffusers model folder (holding ``model_index.json``) under ``roots``, as relative names."""
    return folders_holding(roots, MODEL_INDEX)  # the roots are made strings where the listing is remembered
