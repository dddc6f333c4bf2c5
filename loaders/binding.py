"""Bind a shared LoadedModel to the state a handle asks for (placeholder: plain state only, until the engine lands)."""

from __future__ import annotations

from typing import Sequence


def bind(model, fuses: Sequence, adapters: Sequence, *, lenient: bool = False):
    if fuses or adapters:
        raise NotImplementedError("LoRA binding is not implemented yet")
    return None


def unbind(model) -> None:
    return None
