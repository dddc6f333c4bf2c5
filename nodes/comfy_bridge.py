"""The one place where the pack touches ComfyUI modules — lazily and optionally.

Inside ComfyUI we use its ``folder_paths``, ``comfy.utils.ProgressBar`` and its interrupt check; headless we
use the runtime's equivalents (``runtime.folder_paths``, ``runtime.context``). Every node goes through these
functions so that no node module imports ComfyUI at import time.
"""

from __future__ import annotations

import importlib
from functools import lru_cache


@lru_cache(maxsize=1)
def _comfy_modules():
    """Return (folder_paths, comfy.utils, comfy.model_management) when running inside ComfyUI, else None."""
    try:
        folder_paths = importlib.import_module("folder_paths")
        comfy_utils = importlib.import_module("comfy.utils")
        model_management = importlib.import_module("comfy.model_management")
    except Exception:  # not inside ComfyUI (or a broken install): use the runtime's equivalents
        return None
    return folder_paths, comfy_utils, model_management


def folder_paths():
    """ComfyUI's ``folder_paths`` module, or the runtime's compatible registry."""
    mods = _comfy_modules()
    if mods is not None:
        return mods[0]
    from ..runtime import folder_paths as runtime_folder_paths

    return runtime_folder_paths


def lora_names() -> list[str]:
    """LoRA files and PEFT adapter folders under the loras folders. ComfyUI's own list has files only, so inside
    ComfyUI the PEFT folders under its loras folders are added."""
    paths = folder_paths()
    names = list(paths.get_filename_list("loras"))
    if _comfy_modules() is not None:
        from ..runtime.folder_paths import peft_folder_names

        names = sorted(set(names) | set(peft_folder_names(paths.get_folder_paths("loras"))))
    return names


def lora_full_path(name: str) -> str | None:
    """Absolute path of a name from ``lora_names`` (ComfyUI's ``get_full_path`` finds files only)."""
    paths = folder_paths()
    path = paths.get_full_path("loras", name)
    if path is None and _comfy_modules() is not None:
        from ..runtime.folder_paths import find_peft_folder

        path = find_peft_folder(paths.get_folder_paths("loras"), name)
    return path


def check_interrupted() -> None:
    """Raise if the user interrupted the running prompt (ComfyUI's or the runtime's interrupt)."""
    mods = _comfy_modules()
    if mods is not None:
        mods[2].throw_exception_if_processing_interrupted()
        return
    from ..runtime.context import current_context

    ctx = current_context()
    if ctx is not None:
        ctx.check_interrupted()


class ProgressBar:
    """Per-node progress: ComfyUI's ProgressBar inside ComfyUI, the runtime's progress events headless."""

    def __init__(self, total: int):
        self.total = int(total)
        self.value = 0
        mods = _comfy_modules()
        self._comfy_bar = mods[1].ProgressBar(self.total) if mods is not None else None

    def update_absolute(self, value: int, extra: dict | None = None, total: int | None = None) -> None:
        """Set the progress to ``value`` (of ``total``, which may change: e.g. fuse layers, then steps)."""
        self.value = int(value)
        if total is not None:
            self.total = int(total)
        if self._comfy_bar is not None:
            self._comfy_bar.update_absolute(self.value, self.total)
            return
        from ..runtime.context import current_context

        ctx = current_context()
        if ctx is not None:
            ctx.report_progress(self.value, self.total, extra)
