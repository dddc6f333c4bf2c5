"""``early_contract_refusals``: the step counts a prompt's files declare, checked before anything runs.

Why: the sampler resolves its contract only when it runs, after the model is loaded and every prompt encoded:
minutes on a real 14B model, for a workflow whose LoRA file says "4 steps" while the sampler asks for 20. A
contract is a property of the file (its name, its metadata, a model folder's ``model_index.json``), so it can be
read from the prompt's literal inputs alone, without a model. This check is deliberately narrow: it refuses only
what the sampler would refuse for certain (a literal step count >= 1 with ``enforce_contract`` on, differing from
what an active file upstream of the sampler's model declares); everything else is still the sampler's to decide.
"""

from __future__ import annotations

import os
from typing import Callable

from ..loaders.contracts.schedule_rules import contract_value, mismatch_message
from ..loaders.dispatch.contract_discovery import lora_file_contracts, model_folder_contracts
from ..loaders.errors import LoraBindError
from ..loaders.lora.safetensors_header import check_safetensors_prefix
from .model_check import FILE_INPUTS
from .models import find_model
from .vocabulary import SOCKET_ADAPTER, SOCKET_MODEL, SOCKET_SCHEDULE

LORA_KIND = "loras"
_CONTRACT_SOCKETS = (SOCKET_MODEL, SOCKET_ADAPTER, SOCKET_SCHEDULE)  # what carries a contract to the sampler
_STRENGTH_WORDS = ("strength", "scale")


def early_contract_refusals(prompt: dict, node_classes: dict, registry) -> list[tuple[str, str]]:
    """``[(sampler node id, message)]`` for every sampler whose literal ``steps`` contradicts a contract declared
    by a file upstream of it; empty when nothing can be decided before running."""
    refusals = []
    for node_id, node in prompt.items():
        inputs = node.get("inputs") or {}
        steps = inputs.get("steps")
        if inputs.get("enforce_contract") is not True or not _is_count(steps) or steps < 1:
            continue
        for contract in _declared_contracts(prompt, node_classes, registry, node_id):
            declared = contract_value(contract, "steps")
            if _is_count(declared) and declared != steps:
                refusals.append((node_id, mismatch_message(contract, "steps", "steps", declared, steps)))
                break
    return refusals


def unreadable_lora_refusals(prompt: dict, registry) -> list[tuple[str, str, str]]:
    """``[(node id, input name, message)]`` for each LoRA input naming a ``.safetensors`` file that cannot be one
    by its first 8 bytes (a 0-byte file): refused before the model loads, in the reader's words. Only the prefix
    is read; everything else about the file is the node's to report."""
    refusals = []
    for node_id, node in prompt.items():
        for input_name, value in (node.get("inputs") or {}).items():
            if FILE_INPUTS.get(input_name) != LORA_KIND or not isinstance(value, str):
                continue
            path = registry.get_full_path(LORA_KIND, value) if value.endswith(".safetensors") else None
            try:
                if path is not None and os.path.isfile(path):
                    check_safetensors_prefix(path, value)
            except LoraBindError as exc:
                refusals.append((node_id, input_name, str(exc)))
    return refusals


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _declared_contracts(prompt: dict, node_classes: dict, registry, sampler_id: str):
    """Every ``ScheduleContract`` the files named by the nodes feeding the sampler's model, adapter and schedule
    inputs declare (a node attaching at strength 0 is skipped: it declares nothing then)."""
    for node_id in _contract_upstream(prompt, node_classes, sampler_id):
        inputs = prompt[node_id].get("inputs") or {}
        if any(_is_switched_off(name, value) for name, value in inputs.items()):
            continue
        for value in inputs.values():
            if isinstance(value, str) and value:
                yield from _declaration(registry, value)


def _is_switched_off(name: str, value) -> bool:
    return any(word in name for word in _STRENGTH_WORDS) and isinstance(value, (int, float)) and value == 0


def _declaration(registry, name: str) -> tuple:
    """The contracts the LoRA file or model folder ``name`` declares; none for a name that is neither, or a file
    that cannot be read here (the node that opens it reports that, in its own words)."""
    finders: tuple[tuple[Callable, Callable], ...] = (
        (lambda: registry.get_full_path(LORA_KIND, name), lambda path: lora_file_contracts(path, name)[2]),
        (lambda: find_model(registry, name), lambda path: model_folder_contracts(path, name)[1]),
    )
    for find, declare in finders:
        try:
            path = find()
            if path is not None:
                return declare(str(path))
        except (LoraBindError, ValueError, OSError, KeyError):
            continue
    return ()


def _contract_upstream(prompt: dict, node_classes: dict, sampler_id: str) -> list[str]:
    """Node ids reachable from the sampler through inputs of a contract-carrying socket type."""
    seen, stack = set(), [sampler_id]
    while stack:
        node_id = stack.pop()
        node = prompt.get(node_id) or {}
        declared = _input_types(node_classes.get(node.get("class_type")))
        for name, value in (node.get("inputs") or {}).items():
            linked = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            if linked and declared.get(name) in _CONTRACT_SOCKETS and value[0] not in seen:
                seen.add(value[0])
                stack.append(value[0])
    return sorted(seen)


def _input_types(node_class) -> dict:
    if node_class is None:
        return {}
    declared = node_class.INPUT_TYPES()
    return {name: spec[0] for section in ("required", "optional") for name, spec in (declared.get(section) or {}).items()
            if isinstance(spec, (list, tuple)) and spec and isinstance(spec[0], str)}
