"""A loader's ``model_name`` that is a repository id (``Wan-AI/Wan2.2-T2V-A14B-Diffusers``): the model's published
single files found under the models folders, so a workflow can name a model as vllm-omni and diffusers users do
and run it from what ``lorabind models download`` put there.

Which files: for each component, the first of its published files (bf16, fp8, then each GGUF type: the table's
order) that is present, so whichever storage was downloaded is used; the model is there when every component has
one. A diffusers folder of the same name (``models/diffusers/Wan-AI/Wan2.2-T2V-A14B-Diffusers/``) comes first: the
loader finds it as any folder.
"""

from __future__ import annotations

import os
from typing import Optional

from ..loaders.io.shipped_configs import shipped_model_names
from ..loaders.placement.published import component_files, model_of, repository_of

DENOISER_KIND, VAE_KIND, TEXT_ENCODER_KIND = "diffusion_models", "vae", "text_encoders"


def is_repository_id(name: str) -> bool:
    """A name of the OWNER/NAME shape that a shipped configuration is typed from."""
    return isinstance(name, str) and name.count("/") == 1 and model_of(name) is not None


def repository_files(registry, name: str) -> Optional[dict]:
    """{folder kind: [(name, path), ...]} of the repository's model as found under the models folders (denoisers
    in the configuration's order), or None when it is not a repository id or a component has no file there."""
    if not is_repository_id(name):
        return None
    found: dict = {}
    for files in component_files(model_of(name)).values():
        present = next(((f, path) for f in files if (path := _find(registry, f)) is not None), None)
        if present is None:
            return None
        kind, file_name = present[0].split("/", 1)
        found.setdefault(kind, []).append((file_name, present[1]))
    return found


def present_repositories(registry) -> list:
    """The repository ids whose model is complete under the models folders (the loader's extra choices).

    Remembered while the folders they would be in are unchanged (their mtimes: a file added, replaced or removed
    there changes it): the loader's choices are asked at every validation, and looking for every published file
    of every model each time cost 7 ms."""
    key = _folders_key(registry)
    if _PRESENT.get("key") != key:
        repositories = [repository_of(m) for m in shipped_model_names()]
        _PRESENT.update(key=key, found=[r for r in repositories if r and repository_files(registry, r) is not None])
    return list(_PRESENT["found"])


_PRESENT: dict = {}


def _folders_key(registry) -> tuple:
    key = []
    for kind in (DENOISER_KIND, VAE_KIND, TEXT_ENCODER_KIND):
        try:
            roots = registry.get_folder_paths(kind)
        except KeyError:
            roots = []
        for root in roots:
            try:
                key.append((root, os.stat(root).st_mtime_ns))
            except OSError:
                key.append((root, None))
    return tuple(key)


def repository_hint(kind: str, value) -> str:
    """What a "not in list" error adds for a loader's repository id whose files are not there: the command that
    gets them (no path: the browser sees this message)."""
    if kind != "diffusers" or not is_repository_id(value):
        return ""
    return (f"; a repository id whose published single files are not there: get them with `lorabind models download "
            f"{value} --weights fp8` (or --vram GIB for plan's choice)")


def describe(files: dict) -> str:
    """"published single files: a, b, c" for ``models check``."""
    return "published single files: " + ", ".join(name for entries in files.values() for name, _ in entries)


def _find(registry, destination: str) -> Optional[str]:
    kind, file_name = destination.split("/", 1)
    try:
        return registry.get_full_path(kind, file_name)
    except (KeyError, ValueError):
        return None
