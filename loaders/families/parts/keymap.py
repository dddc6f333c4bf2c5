"""``KeyMap``: how a family's LoRA files name its denoiser's modules (used by ``loaders.lora.mapping`` /
``accounting`` and ``inspect``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


def unchanged(lora, model_family: str):
    """No family-specific rewrite before name mapping."""
    return lora


def no_reason(name: str, model_family: str) -> Optional[str]:
    """No key is expected to miss."""
    return None


@dataclass(frozen=True)
class KeyMap:
    """The key-map functions of one family; a family's ``keymap`` module declares its own.

    ``recognizes(lora)``: the file's module names are this family's (used without a model, e.g. ``inspect``).
    ``map_target(name)``: file-side module name (prefixes and layout suffixes stripped) -> diffusers module path,
    or None. ``prepare(lora, model_family)``: family-specific rewrites of a ``LoraFile`` before name mapping
    (absent-alpha rule, fused-QKV split). ``expected_unmatched_reason(name, model_family)``: why a key that does
    not fit this model is expected (e.g. the Wan2.1 I2V image branch on Wan2.2)."""

    recognizes: Callable[..., bool]
    map_target: Callable[[str], Optional[str]]
    prepare: Callable = unchanged
    expected_unmatched_reason: Callable[[str, str], Optional[str]] = no_reason
