"""Every single-file component lorabind can load, gathered from the families: each family declares the kinds of its
files, their key layouts and tokenizers, and their known configurations on its layout
(``FamilyLayout.single_file_kinds`` / ``known_single_files`` / ``refused_single_files``); the configs they name
ship in the family's package (``io.shipped_configs``).

Detection (``detect.py``) reads a file's header, recognises the component kind by a marker key, then compares a
shape *signature* of the file (widths, layer counts, channels) with the same signature computed from each
config of that kind; the config that matches names the size and variant. Tiny configs are the built-in tiny
models' (``lorabind models build-tiny`` writes their single files); the others are the published models'.
Why gathered on each call: a family registered at run time (a test's) brings its files along.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

from ...families import all_families
from ...io.shipped_configs import shipped_single_file_config
from ...io.single_file_kinds import ComponentKind


def kinds() -> dict:
    """{kind id: ComponentKind} of every family's single files, in registry order, each naming its family."""
    return {kind.kind: dataclasses.replace(kind, family=family.id) for family in all_families()
            for kind in family.layout.single_file_kinds}


def known_models() -> tuple:
    """Every family's known single-file configurations (``KnownModel``)."""
    return tuple(model for family in all_families() for model in family.layout.known_single_files)


def host_denoisers() -> tuple:
    """Denoisers mapped onto a host's own model only (``HostDenoiser``), each naming its family."""
    return tuple(dataclasses.replace(host, family=family.id) for family in all_families()
                 for host in family.layout.host_denoisers)


def refused_kinds() -> tuple:
    """Single files a family recognises but does not load (``RefusedKind``)."""
    return tuple(refused for family in all_families() for refused in family.layout.refused_single_files)


@lru_cache(maxsize=None)
def config(name: str) -> dict:
    """A config a family ships, by name, or a ``.json`` file by path (the bench's generated models, a test
    family's own)."""
    path = Path(name) if name.endswith(".json") else shipped_single_file_config(name)
    if path is None:
        raise KeyError(f"no model family ships a single-file configuration named {name!r}")
    return json.loads(path.read_text(encoding="utf-8"))


def model_class(kind: ComponentKind):
    import importlib

    return getattr(importlib.import_module(kind.library), kind.class_name)
