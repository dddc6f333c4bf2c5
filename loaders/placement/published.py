"""What is published of a shipped configuration, and where: its ``files.json``, THE table of real files.

Each entry names the ComfyUI single file of one component in one storage (``"fp8":
"diffusion_models/….safetensors"``; a GGUF name carries ``{QUANT}``). ``sources`` gives the download URL of every
one of those files and of the distill LoRAs docs/model-files/real-models.md lists for the model, keyed by the same
``folder/name``; ``repository`` is the diffusers repository the configuration is typed from, so that
``Wan-AI/Wan2.2-T2V-A14B-Diffusers`` names the same model as ``wan2.2-t2v-a14b``. ``lorabind plan`` reads the names,
``lorabind models download`` the sources, and the real workflows' ``properties.models`` are tested against them:
one table, no second list of repositories.

Why here and found by path: ``plan`` answers without importing torch (``io.shipped_configs``).
"""

from __future__ import annotations

import functools
import json
from typing import Optional

from ..errors import ModelLoadError
from ..io import json_limits
from ..io.shipped_configs import shipped_model_folder, shipped_model_names

# the published GGUF file of each type (city96 and QuantStack name a mostly-q4_k file "...-Q4_K_M.gguf")
GGUF_FILE_TYPES = {"q8_0": "Q8_0", "q6_k": "Q6_K", "q5_k": "Q5_K_M", "q5_0": "Q5_0", "q4_k": "Q4_K_M", "q4_0": "Q4_0"}
QUANT = "{QUANT}"
_NOT_COMPONENTS = ("sources",)


@functools.lru_cache(maxsize=64)
def _table(model) -> Optional[dict]:
    """The ``files.json`` of a shipped configuration, or None for a diffusers folder or one without it. Read once:
    it is package data, and a loader's choices ask for it at every validation (``usecases.repository_models``)."""
    folder = shipped_model_folder(str(model))  # found by path: a plan answered from the sizes cache imports no torch
    if folder is None:
        return None
    return read_table(folder / "files.json")


def read_table(path) -> Optional[dict]:
    """A shipped configuration's JSON table (package data): None when the file is missing or not an object; a
    file that cannot be read or parsed is refused naming it."""
    try:
        table = json_limits.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: cannot be read: {exc}") from exc
    return table if isinstance(table, dict) else None


def published_files(model) -> dict | None:
    """{component: {"bf16"|"fp8"|"gguf": "folder/name"}} of a shipped configuration (the names of
    docs/model-files/real-models.md), or None for a diffusers folder or a configuration without one."""
    table = _table(model)
    if table is None:
        return None
    return {name: entry for name, entry in table.items() if isinstance(entry, dict) and name not in _NOT_COMPONENTS}


def published_sources(model) -> dict:
    """{"folder/name": download URL} of a shipped configuration, every ``{QUANT}`` spelled out ({} without one)."""
    table = _table(model) or {}
    sources = table.get("sources") if isinstance(table.get("sources"), dict) else {}
    expanded = {}
    for name, url in sources.items():
        if not (isinstance(name, str) and isinstance(url, str)):
            continue
        quants = GGUF_FILE_TYPES.values() if QUANT in name else ("",)
        expanded.update({name.replace(QUANT, quant): url.replace(QUANT, quant) for quant in quants})
    return expanded


def repository_of(model) -> str:
    """The diffusers repository a shipped configuration is typed from ("" when it names none)."""
    repository = (_table(model) or {}).get("repository")
    return repository if isinstance(repository, str) else ""


def model_of(name: str) -> Optional[str]:
    """The shipped configuration ``name`` names: itself, or the one whose ``repository`` it is (None for neither)."""
    if shipped_model_folder(name) is not None:
        return name
    return next((model for model in shipped_model_names() if repository_of(model) == name), None)


def known_sources() -> dict:
    """{"folder/name": URL} of every file any shipped configuration publishes (a workflow's files are looked up
    here when it does not carry its own ``properties.models``)."""
    found: dict = {}
    for model in shipped_model_names():
        for name, url in published_sources(model).items():
            found.setdefault(name, url)
    return found



def component_files(model) -> dict:
    """{component: ["folder/name", ...]} of a shipped configuration: every published file of each component, in
    the table's order (bf16, fp8, then each GGUF type), ``{QUANT}`` spelled out ({} without a table)."""
    found = {}
    for component, entry in (published_files(model) or {}).items():
        names = [n for n in entry.values() if isinstance(n, str)]
        found[component] = [n.replace(QUANT, q) for n in names for q in (GGUF_FILE_TYPES.values() if QUANT in n
                                                                          else ("",))]
    return found
