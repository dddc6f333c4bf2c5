"""``early_contract_refusals``: what a prompt's files declare, checked before anything runs; and
``wrong_family_refusals``: a LoRA of another model family than the model it is bound to, refused the same way.

Why: the sampler resolves its contract only when it runs, after the model is loaded and every prompt encoded:
minutes on a real 14B model, for a workflow whose LoRA file says "4 steps" while the sampler asks for 20. A
contract is a property of the file (its name, its metadata, a model folder's ``model_index.json``), so it can be
read from the prompt's literal inputs alone, without a model. This check is deliberately narrow: it refuses only
what the sampler would refuse for certain (``enforce_contract`` on, literal inputs differing from what an active
file upstream of the sampler's model declares): the step count; the scheduler a file's publisher samples with;
and, where the model's family resolves from its folder's ``model_index.json`` alone, the shift, the guidance
(``cfg`` and ``cfg_low_noise``) and the Wan2.2 expert split (``boundary``). The files found here are a subset of
what the sampler collects, and a subset that breaks a contract breaks it in the whole set; everything else is
still the sampler's to decide.

A LoRA whose module names are another family's (Qwen-Image Lightning in the Wan2.2 pair) would match none of
the model's keys: the fuse refused it only after the model had loaded and both prompts were encoded. Which family
a LoRA file is for is read from the file (its key names, as the contract check reads it), which family a model
is from its folder's ``model_index.json`` or its single file's header, so it is refused before any load too.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Optional

from ..loaders.contract_types import SamplingRequest
from ..loaders.contracts.schedule_rules import contract_value, mismatch_message
from ..loaders.dispatch.contract_discovery import lora_file_contracts, model_file_contracts, model_folder_contracts
from ..loaders.errors import ContractError, LoraBindError
from ..loaders.families import family_for_index
from ..loaders.generation.schedulers import resolve_scheduler
from ..loaders.io.model_index import read_model_index
from ..loaders.lora.safetensors_header import check_safetensors_prefix
from .model_check import FILE_INPUTS
from .models import find_model
from .vocabulary import SOCKET_ADAPTER, SOCKET_MODEL, SOCKET_SCHEDULE

LORA_KIND = "loras"
MODEL_KINDS = ("diffusers", "diffusion_models")  # the FILE_INPUTS kinds that name a model (a folder or a denoiser)
_CONTRACT_SOCKETS = (SOCKET_MODEL, SOCKET_ADAPTER, SOCKET_SCHEDULE)  # what carries a contract to the sampler
_STRENGTH_WORDS = ("strength", "scale")
# the sampler inputs a resolver refusal can be about, in the order a message is searched for them ("cfg_low_noise
# must be 1" before "cfg must be"); "model" when it names none (a conflict or a foreign contract)
_NAMED_INPUTS = ("cfg_low_noise", "cfg", "shift", "steps", "boundary")


def early_contract_refusals(prompt: dict, node_classes: dict, registry) -> list[tuple[str, str]]:
    """``[(sampler node id, message)]`` for every sampler whose literal inputs contradict a contract declared by a
    file upstream of it; empty when nothing can be decided before running."""
    return [(node_id, message) for node_id, _, message in early_refusals_by_input(prompt, node_classes, registry)]


def early_refusals_by_input(prompt: dict, node_classes: dict, registry) -> list[tuple[str, str, str]]:
    """``[(sampler node id, the input refused, message)]``: ``early_contract_refusals`` with the input each is
    about, so a host names the field that set it (the OpenAI-style endpoints' 400)."""
    refusals = []
    for node_id, node in prompt.items():
        inputs = node.get("inputs") or {}
        if inputs.get("enforce_contract") is not True or not _is_count(inputs.get("steps")) or inputs["steps"] < 1:
            continue
        contracts = tuple(_declared_contracts(prompt, node_classes, registry, node_id))
        refusal = contracts and (_steps_refusal(inputs, contracts) or _scheduler_refusal(inputs, contracts)
                                 or _family_refusal(prompt, node_classes, registry, node_id, contracts))
        if refusal:
            refusals.append((node_id, *refusal))
    return refusals


def _steps_refusal(inputs: dict, contracts: tuple) -> Optional[tuple[str, str]]:
    """A literal step count other than a file declares; not with a ``sigmas`` input (their count is the steps
    then) or a denoise below 1 (the schedule is ``steps / denoise`` long)."""
    steps, denoise = inputs["steps"], inputs.get("denoise", 1.0)
    if "sigmas" in inputs or not _is_number(denoise) or float(denoise) != 1.0:
        return None
    for contract in contracts:
        declared = contract_value(contract, "steps")
        if _is_count(declared) and declared != steps:
            return "steps", mismatch_message(contract, "steps", "steps", declared, steps)
    return None


def _scheduler_refusal(inputs: dict, contracts: tuple) -> Optional[tuple[str, str]]:
    """A scheduler other than the one a file's publisher samples with (``default`` takes that one)."""
    scheduler = inputs.get("scheduler")
    if not isinstance(scheduler, str):
        return None
    try:
        resolve_scheduler(scheduler, contracts, scheduler, enforce=True)
    except ContractError as exc:
        return "scheduler", str(exc)
    except ValueError:  # not a scheduler at all: validation has said so
        return None
    return None


def _family_refusal(prompt: dict, node_classes: dict, registry, sampler_id: str,
                    contracts: tuple) -> Optional[tuple[str, str]]:
    """The family's own resolution of the literal request on the model folder upstream (None: no folder, an
    input that is not literal, or a family that decides only when it runs)."""
    request = _literal_request(prompt[sampler_id].get("inputs") or {})
    found = request and _model_folder(prompt, node_classes, registry, sampler_id)
    if not found:
        return None
    folder, name = found
    index = read_model_index(folder)
    message = family_for_index(index).contracts.refusal_before_loading(name, index, contracts, request)
    if message is None:
        return None
    named = next((n for n in _NAMED_INPUTS if re.search(rf"\b{n}( must\b|=)", message)), "model")
    return named, message


def _literal_request(inputs: dict) -> Optional[SamplingRequest]:
    """The SamplingRequest of a sampler whose steps, cfg, shift and boundary are literal numbers and that runs a
    whole schedule of its own (no sigmas input, denoise 1); None otherwise."""
    values = [inputs.get(name, 0.0) for name in ("cfg", "cfg_low_noise", "shift", "boundary", "denoise")]
    if "sigmas" in inputs or not all(_is_number(v) for v in values) or inputs.get("denoise", 1.0) != 1.0:
        return None
    cfg, low, shift, boundary, _ = (float(v) for v in values)
    return SamplingRequest(steps=int(inputs["steps"]), cfg=(cfg, low) if low else cfg, shift=shift,
                           boundary=boundary or None, enforce_contract=True)


def _model_folder(prompt: dict, node_classes: dict, registry, sampler_id: str) -> Optional[tuple]:
    """``(folder, model name)`` of the diffusers folder a node upstream of the sampler names, or None."""
    for node_id in _contract_upstream(prompt, node_classes, sampler_id):
        for value in (prompt[node_id].get("inputs") or {}).values():
            if not isinstance(value, str) or not value:
                continue
            try:
                folder = find_model(registry, value)
            except (LoraBindError, ValueError, OSError):
                continue
            if folder is not None:
                return str(folder), value
    return None


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


def wrong_family_refusals(prompt: dict, node_classes: dict, registry) -> list[tuple[str, str, str]]:
    """``[(node id, input name, message)]`` for each LoRA input whose file is another model family's LoRA than
    the model that reaches its node (through model sockets); empty when either family cannot be told here."""
    refusals = []
    for node_id, node in prompt.items():
        inputs = node.get("inputs") or {}
        loras = {name: value for name, value in inputs.items() if FILE_INPUTS.get(name) == LORA_KIND
                 and isinstance(value, str) and value and not _switched_off_input(inputs, name)}
        if not loras:
            continue
        models = [model for upstream in _upstream(prompt, node_classes, node_id, (SOCKET_MODEL,))
                  for model in _model_families((prompt.get(upstream) or {}).get("inputs") or {}, registry)]
        for input_name, lora_name in loras.items() if models else ():
            lora_family = _lora_family(registry, lora_name)
            for model_name, model_family in models:
                if lora_family is not None and lora_family is not model_family:
                    refusals.append((node_id, input_name, _wrong_family(lora_name, lora_family, model_name,
                                                                         model_family)))
                    break
    return refusals


def _wrong_family(lora_name: str, lora_family, model_name: str, model_family) -> str:
    """The refusal, without the ``lenient`` way out: skipping the keys that match nothing would skip them all."""
    return (f"{lora_name} is a {'/'.join(lora_family.model_families)} LoRA (its module names are that family's), "
            f"not one for {model_name}, a {'/'.join(model_family.model_families)} model: none of its keys would "
            f"apply. Choose a LoRA made for this model")


def _switched_off_input(inputs: dict, lora_input: str) -> bool:
    """The pair's ``high_noise_strength`` for ``high_noise_lora``, a fuse's ``strength`` for ``lora_name``: 0 is
    off (declares nothing, applies nothing)."""
    prefix = lora_input.removesuffix("lora").removesuffix("_name")
    return any(_is_switched_off(name, value) for name, value in inputs.items()
               if name.startswith(prefix) or name in _STRENGTH_WORDS)


def _lora_family(registry, name: str):
    try:
        path = registry.get_full_path(LORA_KIND, name)
        return lora_file_contracts(str(path), name)[1] if path is not None else None
    except (LoraBindError, ValueError, OSError, KeyError):
        return None  # the node that opens it reports that, in its own words


def _model_families(inputs: dict, registry) -> list:
    """[(model name, ModelFamily)] of the model folder or denoiser files a loader node's inputs name."""
    found = []
    for input_name, value in inputs.items():
        kind = FILE_INPUTS.get(input_name)
        if kind not in MODEL_KINDS or not isinstance(value, str) or not value:
            continue
        try:
            path = find_model(registry, value) if kind == "diffusers" else registry.get_full_path(kind, value)
            family = None if path is None else (model_folder_contracts if kind == "diffusers"
                                                else model_file_contracts)(str(path), value)[0]
        except (LoraBindError, ValueError, OSError, KeyError):
            continue
        if family is not None:
            found.append((value, family))
    return found


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    return _upstream(prompt, node_classes, sampler_id, _CONTRACT_SOCKETS)


def _upstream(prompt: dict, node_classes: dict, start_id: str, sockets: tuple) -> list[str]:
    """Node ids reachable from ``start_id`` through inputs of the ``sockets`` types."""
    seen, stack = set(), [start_id]
    while stack:
        node_id = stack.pop()
        node = prompt.get(node_id) or {}
        declared = _input_types(node_classes.get(node.get("class_type")))
        for name, value in (node.get("inputs") or {}).items():
            linked = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            if linked and declared.get(name) in sockets and value[0] not in seen:
                seen.add(value[0])
                stack.append(value[0])
    return sorted(seen)


def _input_types(node_class) -> dict:
    if node_class is None:
        return {}
    declared = node_class.INPUT_TYPES()
    return {name: spec[0] for section in ("required", "optional") for name, spec in (declared.get(section) or {}).items()
            if isinstance(spec, (list, tuple)) and spec and isinstance(spec[0], str)}
