"""Model-family registry: one module per family holds its key maps and its sampling contracts.

Every family module exports the same interface (``FamilyModule`` below); the engine, nodes and CLI only go
through the dispatch functions here, so adding a family means adding one module to ``_FAMILY_MODULES``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Optional, Protocol

from ..handles import ScheduleContract
from ..lora.canonical import LoraFile

_FAMILY_MODULES = ("wan", "qwen_image", "minimax_h3")


class FamilyModule(Protocol):
    FAMILY: str  # key-map family id: "wan", "qwen_image", "minimax_h3"
    MODEL_FAMILIES: tuple  # LoadedModel.family values served: ("wan2.1", "wan2.2_moe"), ...

    def recognizes(self, lora: LoraFile) -> bool:
        """True when the file's module names are this family's (used without a model, e.g. ``inspect``)."""

    def prepare(self, lora: LoraFile, model_family: str) -> LoraFile:
        """Family-specific rewrites before name mapping (absent-alpha rule, fused-QKV split, ...)."""

    def map_target(self, name: str) -> Optional[str]:
        """File-side module name (prefixes and layout suffixes already stripped) -> diffusers module path."""

    def expected_unmatched_reason(self, name: str, model_family: str) -> Optional[str]:
        """Why a key that does not fit this model is expected (e.g. Wan2.1 I2V image branch on Wan2.2)."""

    def declared_contract(self, file_name: str, metadata: dict, rank: Optional[int]) -> Optional[ScheduleContract]:
        """The sampling contract an artifact declares by name/metadata; raises ContractError if refused."""

    def checkpoint_contract(self, model_index: dict, model_name: str) -> Optional[ScheduleContract]:
        """A schedule pinned by the checkpoint itself (``model_index.json``), if any."""


def family_modules() -> tuple:
    return tuple(import_module(f".{name}", __name__) for name in _FAMILY_MODULES)


def for_model_family(model_family: str):
    """The family module serving a ``LoadedModel.family`` value."""
    for module in family_modules():
        if model_family in module.MODEL_FAMILIES:
            return module
    raise KeyError(f"no LoRA key map for model family {model_family!r}")


def guess_family(lora: LoraFile):
    """The family module whose names the file uses, or None (diffusers/PEFT names of an unknown model)."""
    for module in family_modules():
        if module.recognizes(lora):
            return module
    return None


def checkpoint_contracts(model) -> tuple:
    """Contracts pinned by a loaded checkpoint (a ``LoadedModel``), as a tuple for ``ModelHandle.contracts``."""
    contract = for_model_family(model.family).checkpoint_contract(model.model_index, model.name)
    return (contract,) if contract is not None else ()
