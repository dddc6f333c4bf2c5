"""Where a model file a workflow names comes from, for ``lorabind models check``'s MISSING lines.

Why: a missing file's line said only where it was looked for; a new user still had to find which release it
belongs to. The names lorabind knows are the published ones of its shipped configurations (each one's
``files.json``, the table of docs/model-files/real-models.md), so a missing file is traced to the configuration
that lists it, with the file's download address from the table (``loaders.placement.published``, the one table
``models download`` reads), else the page.
"""

from __future__ import annotations

from ..loaders.io.shipped_configs import shipped_model_names
from ..loaders.placement.published import component_files, known_sources
from . import host

REAL_MODELS_PAGE = "docs/model-files/real-models.md"


def source_of(kind: str, name: str) -> str:
    """"https://…" or "published for wan2.2-t2v-a14b (docs/model-files/real-models.md)" for a file of folder
    kind ``kind`` named ``name`` (relative to that folder); a name no shipped configuration lists gets the
    page too, saying so."""
    destination = f"{kind}/{name.replace(chr(92), '/').rsplit('/', 1)[-1]}"
    url = known_sources().get(destination)
    if url:
        return url
    config = next((model for model in shipped_model_names()
                   if any(destination in files for files in component_files(model).values())), None)
    if config is not None:
        return f"published for {config} ({REAL_MODELS_PAGE})"
    if kind == "loras" and destination.rsplit("/", 1)[-1] in _published_loras():
        return f"a published distill LoRA ({REAL_MODELS_PAGE} names its repository)"
    return f"not a published file lorabind lists; the real models it runs: {REAL_MODELS_PAGE}"


def _published_loras() -> frozenset:
    """The distill LoRAs' published names: the built-in fixture LoRAs carry them (``lorabind-tiny/<name>``)."""
    factory = host.builtin_models()
    names = factory.fixture_lora_names() if factory is not None else ()
    return frozenset(name.rsplit("/", 1)[-1] for name in names)
