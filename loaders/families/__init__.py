"""Model families: one package per family, each declaring an ``interface.ModelFamily`` from its parts.

The registry below is the only way the engine, the nodes, the CLI and the server reach family behaviour: they
ask for the family of a model (``family_for``), of a ``model_index.json`` (``family_for_index``, or just its
model family id: ``detect_model_family``), of a family id (``family_by_id``) or of a LoRA file's names
(``guess_family``), and call the family object. Adding a family means adding one package and its name to
``_FAMILY_PACKAGES`` (or, for a family that lives outside the pack, such as a test's, one ``register`` call).
The helpers below answer the questions asked before a model is loaded (roles of an index's components, library
requirements, shipped configurations, built-in tiny models) from the families, so no table keyed by family id
exists outside ``families/``.
"""

from __future__ import annotations

import functools
import re
from importlib import import_module
from typing import Optional

from ..contracts.baked import baked_contracts
from ..errors import ModelLoadError
from .interface import ModelFamily
from .interface import has_expert_pair as _has_expert_pair

# Registry order is the order ``guess_family`` tries (Wan's names first, as before the registry existed).
_FAMILY_PACKAGES = ("wan", "qwen_image", "minimax_h3")
_registered: list = []  # families registered at run time (``register``), after the packages


@functools.cache
def _packaged_families() -> tuple:
    """The pack's own family objects, imported on first use (importing the registry stays cheap) and then kept:
    ``family_for`` runs several times per sampler run, and re-importing by name cost more than the look-up."""
    return tuple(import_module(f".{name}", __name__).FAMILY for name in _FAMILY_PACKAGES)


def all_families() -> tuple:
    """Every family object, in registry order."""
    return _packaged_families() + tuple(_registered)


def register(family: ModelFamily) -> None:
    """Add a family object that is not one of the pack's packages (a test's toy family); idempotent."""
    if family not in _registered:
        _registered.append(family)


def unregister(family: ModelFamily) -> None:
    if family in _registered:
        _registered.remove(family)


def family_serving(model_family: str) -> Optional[ModelFamily]:
    """The family serving a model family id (``"wan2.2_moe"``) or a key-map id (``"wan"``), or None."""
    for family in all_families():
        if model_family in family.model_families or model_family == family.id:
            return family
    return None


def family_by_id(model_family: str) -> ModelFamily:
    """Like ``family_serving`` but raising KeyError for an unknown id."""
    family = family_serving(model_family)
    if family is None:
        raise KeyError(f"no LoRA key map for model family {model_family!r}")
    return family


# The LoRA engine's historical name for ``family_by_id``.
for_model_family = family_by_id


def family_for(model) -> ModelFamily:
    """The family of anything with a ``.family`` id: a LoadedModel, a ModelHandle, a latent or conditioning."""
    return family_by_id(model.family)


def has_expert_pair(model) -> bool:
    """True for a loaded model (or handle) that switches between a high- and a low-noise expert (Wan2.2 MoE)."""
    loaded = getattr(model, "model", model)
    return _has_expert_pair(family_for(loaded), loaded)


def made_for(handle, model) -> bool:
    """True when a conditioning or latent handle was made for ``model``'s model family (Wan2.1 embeds do not
    fit a Wan2.2 model: the shapes may agree while the text encoders differ)."""
    return handle.family == model.family


def detect_model_family(model_index: dict) -> str:
    """Model family id from a ``model_index.json`` dict; raises ``ModelLoadError`` for unsupported pipelines."""
    for family in all_families():
        found = family.layout.detect(model_index)
        if found is not None:
            return found
    class_name = str(model_index.get("_class_name", ""))
    raise ModelLoadError(
        f"unsupported pipeline class {class_name!r} in model_index.json: lorabind supports Wan2.1/Wan2.2 "
        "(WanPipeline), Qwen-Image (QwenImagePipeline) and MiniMax-H3"
    )


def family_for_index(model_index: dict) -> ModelFamily:
    """The family that loads a ``model_index.json`` (``ModelLoadError`` for unsupported pipelines)."""
    return family_by_id(detect_model_family(model_index))


def guess_family(lora) -> Optional[ModelFamily]:
    """The family whose names the LoRA file uses, or None (diffusers/PEFT names of an unknown model)."""
    for family in all_families():
        if family.keymap.recognizes(lora):
            return family
    return None


def named_for_another_family(file_name: str, family_id: str) -> bool:
    """True when ``file_name`` carries the words another family's files are named with (``file_name_words``)."""
    return any(family.id != family_id and family.layout.file_name_words
               and re.search(family.layout.file_name_words, file_name, re.IGNORECASE) for family in all_families())


def checkpoint_contracts(model) -> tuple:
    """Contracts pinned by a loaded checkpoint (a ``LoadedModel``), as a tuple for ``ModelHandle.contracts``."""
    contract = family_for(model).contracts.checkpoint_contract(model.model_index, model.name)
    return ((contract,) if contract is not None else ()) + baked_contracts(model.model_index, model.name)


def component_roles(model_index: dict) -> dict:
    """{component: role} of a ``model_index.json``'s weighted components, as its family names them."""
    return family_for_index(model_index).layout.component_roles(model_index)


def denoiser_components(model_index: dict) -> list:
    """The set denoisers of a ``model_index.json``, the main one first."""
    return family_for_index(model_index).layout.denoiser_components(model_index)


def requirements_for(requirements_id: str) -> tuple:
    """``({distribution: minimum version}, label)`` of a requirements id (``FamilyLayout.requirements``);
    ``({}, id)`` for an id no family lists."""
    for family in all_families():
        layout = family.layout
        if requirements_id in layout.requirements:
            return layout.requirements[requirements_id], layout.labels.get(requirements_id, requirements_id)
    return {}, requirements_id


def real_config_names() -> tuple:
    """The shipped real configurations every family lists (``lorabind plan NAME``)."""
    return tuple(name for family in all_families() for name in family.layout.real_configs)


def tiny_recipes() -> dict:
    """{built-in tiny model name: TinyRecipe} of every family."""
    return {recipe.name: recipe for family in all_families() for recipe in family.layout.tiny_models}


def example_order() -> tuple:
    """The example templates in the order a newcomer meets them: every family's featured examples (the main one
    first, registry order), then the rest of each family's (adapter and single-file variants)."""
    layouts = [family.layout for family in all_families()]
    featured = [name for layout in layouts for name in layout.example_templates[:layout.featured_examples]]
    rest = [name for layout in layouts for name in layout.example_templates[layout.featured_examples:]]
    return tuple(featured + rest)


def lora_components() -> list:
    """Every denoiser name a LoRA can be attached to by name, in registry order (the adapter nodes' choices)."""
    return list(dict.fromkeys(name for family in all_families() for name in family.layout.lora_components))
