"""``early_contract_refusals``: the sampling contracts a prompt's files declare, checked before anything runs.

Why: the sampler resolves its contract only when it runs, after the model is loaded and every prompt encoded:
minutes on a real 14B model, for a workflow whose LoRA file says "4 steps" while the sampler asks for 20. A
contract is a property of the file (its name, its metadata, a model folder's ``model_index.json``), so it can be
read from the prompt's literal inputs alone, without a model. This check is deliberately narrow: it refuses only
what the sampler would refuse for certain (a literal steps, cfg, shift or scheduler, with ``enforce_contract`` on,
differing from what an active file upstream of the sampler's model declares); everything else (a value that
comes through a link, conflicts between files, a family's own checks) is still the sampler's to decide.
"""

from __future__ import annotations

import math
import os
from typing import Callable

from ..loaders.contracts.schedule_rules import contract_value, mismatch_message
from ..loaders.dispatch.contract_discovery import lora_file_contracts, model_folder_contracts
from ..loaders.errors import ContractError, LoraBindError
from ..loaders.generation import schedulers
from ..loaders.lora.safetensors_header import check_safetensors_prefix
from .model_check import FILE_INPUTS
from .models import find_model
from .vocabulary import SOCKET_ADAPTER, SOCKET_MODEL, SOCKET_SCHEDULE

LORA_KIND = "loras"
_CONTRACT_SOCKETS = (SOCKET_MODEL, SOCKET_ADAPTER, SOCKET_SCHEDULE)  # what carries a contract to the sampler
_STRENGTH_WORDS = ("strength", "scale")
_EARLY_FIELDS = ("steps", "shift", "cfg", "scheduler")
_INPUTS_OF = {"steps": ("steps",), "shift": ("shift",), "cfg": ("cfg", "cfg_low_noise")}


def early_contract_refusals(prompt: dict, node_classes: dict, registry) -> list[tuple[str, str, str]]:
    """``[(sampler node id, input name, message)]`` for every sampler a contract declared by a file upstream of it refuses
    for certain: a literal ``steps`` (>= 1), ``cfg`` (and ``cfg_low_noise`` when set), ``shift`` (non-zero, no
    ``sigmas`` input) or ``scheduler`` (other than ``default``) that differs from what the file declares, with
    ``enforce_contract`` on; empty when nothing can be decided before running. One refusal per sampler, the
    first field in the sampler's own order (steps, shift, cfg, scheduler)."""
    refusals = []
    for node_id, node in prompt.items():
        inputs = node.get("inputs") or {}
        if inputs.get("enforce_contract") is not True or not _is_count(inputs.get("steps")):
            continue
        contracts = list(_declared_contracts(prompt, node_classes, registry, node_id))
        breach = next((b for b in (_breach(inputs, contracts, field) for field in _EARLY_FIELDS) if b), None)
        if breach is not None:
            refusals.append((node_id, *breach))
    return refusals


def _breach(inputs: dict, contracts: list, field: str) -> tuple[str, str] | None:
    """(input name, the sampler's refusal) of ``field`` by the first contract whose declared value the literal
    input differs from, worded as the sampler words it; None when the sampler would not refuse it."""
    if field == "scheduler":
        requested = inputs.get("scheduler")
        if not isinstance(requested, str) or requested == schedulers.DEFAULT:
            return None
        try:
            schedulers.resolve_scheduler(requested, contracts, schedulers.EULER, True)
        except ContractError as exc:
            return "scheduler", str(exc)
        except ValueError:  # not a scheduler at all: validation names it
            return None
        return None
    for input_name in _INPUTS_OF[field]:
        requested = inputs.get(input_name)
        if not _is_compared(input_name, requested, inputs):
            continue
        for contract in contracts:
            declared = contract_value(contract, field)
            if declared is not None and not _agrees(field, declared, requested):
                return input_name, mismatch_message(contract, field, input_name, declared, requested)
    return None


def _is_compared(input_name: str, value, inputs: dict) -> bool:
    """Whether the sampler compares this input's value with the contract as it stands: a number, not a link;
    steps >= 1 (0 means the contract's) without a ``sigmas`` input (their count is the steps then) or a denoise
    below 1 (the schedule is longer); shift non-zero (some families read 0 as "the model's") without a ``sigmas``
    input; ``cfg_low_noise`` only when set (0: one cfg for both experts)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    sigmas_given = inputs.get("sigmas") is not None
    if input_name == "steps":
        denoise = inputs.get("denoise", 1.0)
        return _is_count(value) and value >= 1 and not sigmas_given and not (
            isinstance(denoise, (int, float)) and denoise < 1)
    if input_name == "shift":
        return value != 0 and not sigmas_given
    return value != 0 if input_name == "cfg_low_noise" else True


def _agrees(field: str, declared, requested) -> bool:
    if field == "steps":
        return not _is_count(declared) or declared == requested
    return math.isclose(float(declared), float(requested), rel_tol=0.0, abs_tol=1e-6)


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
