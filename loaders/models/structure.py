"""A model's denoisers as structure only: parameter names and shapes from the safetensors headers.

Why: key accounting (``lorabind inspect --model``) compares module names and parameter shapes, nothing else.
Loading the pipeline for that reads every weight of every component (text encoder, VAE, both experts: about
70 GB for Wan2.2 A14B), and even building the modules from their configs costs the diffusers import. A
safetensors header lists every stored parameter with its shape; the tree built from it holds meta tensors
only, so no weight byte is read and nothing is allocated.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelLoadError
from ..io.model_index import read_model_index
from ..meta_modules import tree_on_meta
from .diffusers_folder import require_libraries
from .store import denoiser_names, detect_family


@dataclass(eq=False)
class ModelStructure:
    """What accounting needs of a model (the fields ``LoadedModel`` has under the same names)."""

    path: str
    name: str
    family: str
    components: dict = field(default_factory=dict)  # denoiser name -> module tree of meta parameters
    model_index: dict = field(default_factory=dict)


def load_structure(path, *, name: str = "") -> ModelStructure:
    """The denoisers of a diffusers folder as meta module trees; reads ``model_index.json`` and the weight files'
    headers only."""
    folder = Path(path).expanduser().resolve()
    model_index = read_model_index(folder)
    family = detect_family(model_index)
    require_libraries(model_index, family, f"{folder.name} ({family})", folder)
    components = {component: tree_on_meta(_stored_shapes(folder / component))
                  for component in denoiser_names(model_index)}
    return ModelStructure(path=str(folder), name=name or folder.name, family=family, components=components,
                          model_index=model_index)


def _stored_shapes(component_dir: Path) -> dict:
    """{parameter name: shape} over every shard of a component, from the headers (safetensors reads only those
    until a tensor is asked for)."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(component_dir, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"{component_dir}: no .safetensors weight files (only safetensors is read)")
    shapes = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        except Exception as exc:  # a truncated or foreign file: name it
            raise ModelLoadError(f"{file}: cannot read its safetensors header: {exc}") from None
    return shapes
