"""A model's denoisers as structure only: modules built on the meta device from their ``config.json``.

Why: key accounting (``lorabind inspect --model``) compares module names and parameter shapes, nothing else.
Loading the pipeline for that reads every weight of every component (text encoder, VAE, both experts: about
70 GB for Wan2.2 A14B). A module built on the meta device (``memory.component_on_meta``) has exactly the
parameters diffusers would load, with their shapes, and allocates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import compat
from .memory import component_on_meta
from .model_store import denoiser_names, detect_family, read_model_index


@dataclass(eq=False)
class ModelStructure:
    """What accounting needs of a model (the fields ``LoadedModel`` has under the same names)."""

    path: str
    name: str
    family: str
    components: dict = field(default_factory=dict)  # denoiser name -> module on the meta device
    model_index: dict = field(default_factory=dict)


def load_structure(path, *, name: str = "") -> ModelStructure:
    """The denoisers of a diffusers folder on the meta device; reads ``model_index.json`` and their configs only."""
    folder = Path(path).expanduser().resolve()
    model_index = read_model_index(folder)
    family = detect_family(model_index)
    compat.require(family, f"{folder.name} ({family})")
    components = {component: component_on_meta(folder, component, model_index).eval()
                  for component in denoiser_names(model_index)}
    return ModelStructure(path=str(folder), name=name or folder.name, family=family, components=components,
                          model_index=model_index)
