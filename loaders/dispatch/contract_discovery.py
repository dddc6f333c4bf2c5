"""Sampling contracts: collect them from the graph's handles and have the model's family resolve the request.

Contracts come from the model handle (checkpoint-pinned, fuses), the adapter handle and the schedule input; an
artifact applied at strength/scale 0 is off and declares nothing. How a request is resolved against them is the
family's (``loaders/families``): Wan and Qwen-Image follow ``schedule_rules`` (one sigma list), MiniMax-H3 its
own resolver (two schedules, a task, a partition). Either way a ContractError is raised before anything touches
a weight.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from .. import families
from ..contract_types import ResolvedSchedule, SamplingRequest, ScheduleContract  # noqa: F401  (public API)
from ..contracts.baked import baked_contracts
from ..contracts.schedule_rules import contract_dict, describe_artifact  # noqa: F401  (public API)
from ..contracts.table import table_entry
from ..errors import ModelLoadError
from ..io.model_index import read_model_index
from ..lora import read_lora
from ..lora.preparation import lora_rank
from ..models.single_file.baked_files import baked_index_entry
from ..models.single_file.detect import detect


def resolve_schedule(model, adapters, schedule, request: SamplingRequest) -> ResolvedSchedule:
    """Collect, check and resolve. ``model`` is a ModelHandle, ``adapters`` an AdapterHandle or None,
    ``schedule`` a ScheduleHandle or None. Raises ContractError before anything touches a weight."""
    contracts = collect_contracts(model, adapters, schedule)
    return families.family_for(model).contracts.resolve_schedule(model, contracts, request)


def collect_contracts(model, adapters=None, schedule=None) -> tuple:
    """Every contract in force: the model handle's (pinned + fuses + model-level adapters), the adapter
    handle's and the schedule input's. A contract whose artifact is only applied at strength/scale 0 is dropped:
    an adapter that is off must not constrain sampling (reference §5.3 pitfall 7)."""
    specs = tuple(model.fuses) + tuple(model.adapters)
    found = list(model.contracts)
    if adapters is not None:
        specs += tuple(adapters.adapters)
        found += list(adapters.contracts)
    if schedule is not None:
        found.append(schedule.contract)
    active = [c for c in found if c.kind == "pinned" or not _switched_off(c.source, specs)]
    unique = []
    for contract in active:  # the same contract object reached twice (shared upstream) counts once
        if not any(contract is seen for seen in unique):
            unique.append(contract)
    return tuple(unique)


def contract_to_dict(contract: Optional[ScheduleContract]) -> dict:
    """JSON-able view of a contract for node UI output and ``inspect --json`` ({} when None).

    Each family words its own contracts (MiniMax-H3 has ``flow_shift``, ``audio_flow_shift``,
    ``base_schedule``...), so every caller gets the right view for any family from here."""
    if contract is None:
        return {}
    family = families.family_serving(contract.family)
    return family.contracts.contract_to_dict(contract) if family is not None else contract_dict(contract)


def _switched_off(source: str, specs: Sequence) -> bool:
    """True when the artifact named ``source`` is attached only at strength/scale 0."""
    strengths = [_spec_strength(spec) for spec in specs if source in _spec_names(spec)]
    return bool(strengths) and all(value == 0 for value in strengths)


def _spec_names(spec) -> set:
    names = {os.path.basename(spec.path.rstrip("/\\"))}
    if spec.name:
        names |= {spec.name, os.path.basename(spec.name.rstrip("/\\"))}
    return names


def _spec_strength(spec) -> float:
    return float(spec.strength if hasattr(spec, "strength") else spec.scale)



def lora_file_contract(path: str, lora_name: str | None = None) -> dict:
    """What a LoRA file or PEFT folder declares, for the editor's contract endpoint (``inspect --json`` reports
    the same ``contract``): ``{"file", "family", "contract", "contracts", "reason"}``; ``contract`` is None, and
    ``reason`` says why, when it declares none. ``lora_name`` is the name relative to the loras root (some
    releases keep the step count in the folder name)."""
    name, family, found = lora_file_contracts(path, lora_name)
    contract = contract_to_dict(found[0]) if found else None
    reason = None
    if family is None:
        reason = "no known model family matches its keys"
    elif contract is None:
        reason = "its name and metadata declare no sampling contract"
    return _declaration(name, family, [contract] if contract else [], reason)


def lora_file_contracts(path: str, lora_name: str | None = None) -> tuple:
    """``(file name, family or None, (ScheduleContract,) or ())``: a LoRA's declaration as objects, read from its
    name, header, metadata and contract table (no model needed)."""
    lora = read_lora(path)
    family = families.guess_family(lora)
    contract = discover_contract(path, lora_name, family=family, lora=lora)
    return lora.name, family, (contract,) if contract is not None else ()


def discover_contract(path: str, lora_name: str | None = None, *, family=None, lora=None,
                      strength: float = 1.0) -> Optional[ScheduleContract]:
    """THE contract a LoRA file or PEFT folder declares: ``inspect``, the fuse and adapter verbs (so the
    sampler), the contract endpoint, ``merge``, ``extract`` and the prompt's early check all ask here, so they
    cannot disagree about one file. None when there is no family, no contract, or the file is applied at
    strength 0 (off).

    Sources, strongest first: the file's safetensors metadata, a matching ``lorabind-contracts.json`` entry
    beside it (``contract_table``), its name. The name is read with the folder holding the file taken from
    ``path`` (not ``lora_name``), so a caller holding the loras-relative name and one holding a path on disk
    read the same thing (LightX2V's release layout keeps the step count in the folder). ``family`` defaults to
    the one the file's keys say; ``lora`` is the file as read, when the caller has it.
    """
    lora = lora if lora is not None else read_lora(path)
    family = family if family is not None else families.guess_family(lora)
    if family is None or strength == 0:
        return None
    full = os.path.abspath(str(path).rstrip("/\\"))
    named = f"{os.path.basename(os.path.dirname(full))}/{os.path.basename(full)}"
    return family.contracts.declared_contract(named, lora.metadata, lora_rank(lora), table_entry(path))


def model_folder_contract(path: str, model_name: str) -> dict:
    """What a diffusers model folder pins, read from its ``model_index.json`` alone (no weight is loaded): the
    checkpoint's own schedule and the contracts ``lorabind merge`` baked in, the ones the model loader puts on
    its handle. Same shape as ``lora_file_contract``; ``contract`` is the first of ``contracts``."""
    family, found = model_folder_contracts(path, model_name)
    reason = None if found else "its model_index.json pins no schedule and carries no baked-in contract"
    return _declaration(model_name, family, [contract_to_dict(c) for c in found], reason)


def model_folder_contracts(path: str, model_name: str) -> tuple:
    """``(family, (ScheduleContract, ...))`` a model folder's ``model_index.json`` pins or carries baked in."""
    index = read_model_index(path)
    family = families.family_for_index(index)
    pinned = family.contracts.checkpoint_contract(index, model_name)
    return family, ((pinned,) if pinned is not None else ()) + baked_contracts(index, model_name)


def model_file_contract(path: str, model_name: str) -> dict:
    """What a single denoiser file carries: the contracts ``lorabind merge`` baked into its metadata, the ones
    ``LoraBindCheckpointLoader`` puts on its handle. Same shape as ``model_folder_contract``; ``model_name`` (the
    name inside the models folder) is the only name messages and the answer use."""
    family, found = model_file_contracts(path, model_name)
    reason = None if found else "its metadata carries no contract baked in by lorabind merge"
    return _declaration(model_name, family, [contract_to_dict(c) for c in found], reason)


def model_file_contracts(path: str, model_name: str) -> tuple:
    """``(family, (ScheduleContract, ...))`` baked into a single denoiser file, read from its header alone and
    turned into contracts exactly as the loader does (``baked_index_entry`` then ``baked_contracts``), so the
    editor, ``inspect`` and the sampler cannot disagree about a merged file. ``ModelLoadError`` naming the file
    when it is no denoiser file."""
    detected = detect(path, model_name)
    if detected.role != "denoiser":
        raise ModelLoadError(f"{model_name}: a {detected.role.replace('_', ' ')} file ({detected.describe()}); "
                             "only denoiser files carry merged-in contracts")
    return families.family_by_id(detected.family), baked_contracts(baked_index_entry([detected]), model_name)


def _declaration(name: str, family, contracts: list, reason) -> dict:
    return {"file": name, "family": family.id if family else None, "contract": contracts[0] if contracts else None,
            "contracts": contracts, "reason": reason}
