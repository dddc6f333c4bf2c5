"""Where the configurations a model family ships live: in its own package, ``families/<package>/configs/``.

- ``configs/models/<name>/``: a real model's diffusers folder without weights (``model_index.json``, each
  component's ``config.json``, ``files.json``), typed from the public release its ``model_index.json`` names in
  ``_lorabind_source``, which ``lorabind plan NAME`` sizes;
- ``configs/single_files/<name>.json``: one single-file configuration (a published or tiny model's), which the
  single-file detector compares a file's shapes with.

Why found by path, not through the family registry: ``plan`` answers from its sizes cache without importing torch,
and importing the families imports it. A family package is a folder like any other here; the names are the
families' own (each lists them on its layout), so nothing here knows which family ships what.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

FAMILY_PACKAGES = Path(__file__).resolve().parents[1] / "families"


def _plain(name: str) -> bool:
    return bool(name) and "/" not in name and os.sep not in name and name not in (".", "..")


def _family_packages() -> list:
    return sorted(entry for entry in FAMILY_PACKAGES.iterdir() if (entry / "configs").is_dir())


def shipped_model_folder(name: str) -> Optional[Path]:
    """The folder of the real model configuration ``name`` a family ships, None when no family ships it."""
    if not _plain(str(name)):
        return None
    for package in _family_packages():
        folder = package / "configs" / "models" / str(name)
        if (folder / "model_index.json").is_file():
            return folder
    return None


def shipped_single_file_config(name: str) -> Optional[Path]:
    """The ``.json`` of the single-file configuration ``name`` a family ships, None when no family ships it."""
    if not _plain(str(name)):
        return None
    for package in _family_packages():
        path = package / "configs" / "single_files" / f"{name}.json"
        if path.is_file():
            return path
    return None


def shipped_model_names() -> list:
    """Every real model configuration the families ship (``configs/models/<name>/``), sorted."""
    return sorted(folder.name for package in _family_packages()
                  for folder in (package / "configs" / "models").glob("*") if (folder / "model_index.json").is_file())
