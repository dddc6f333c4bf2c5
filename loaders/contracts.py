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

from . import families
from .contract_types import ResolvedSchedule, SamplingRequest, ScheduleContract  # noqa: F401  (public API)
from .schedule_rules import contract_dict, describe_artifact  # noqa: F401  (public API)


def resolve_schedule(model, adapters, schedule, request: SamplingRequest) -> ResolvedSchedule:
    """Collect, check and resolve. ``model`` is a ModelHandle, ``adapters`` an AdapterHandle or None,
    ``schedule`` a ScheduleHandle or None. Raises ContractError before anything touches a weight."""
    contracts = collect_contracts(model, adapters, schedule)
    return families.family_for(model).resolve_schedule(model, contracts, request)


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
    return family.contract_to_dict(contract) if family is not None else contract_dict(contract)


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
    """What a LoRA file declares, for ``inspect --json`` and the editor's contract endpoint alike (one answer for
    both): ``{"file", "family", "contract", "reason"}``, ``contract`` None with the reason when it declares none.
    ``lora_name`` is the name relative to the loras root (some releases keep the step count in the folder name)."""
    from .lora import read_lora
    from .lora.preparation import declared_contract

    lora = read_lora(path)
    family = families.guess_family(lora)
    contract = contract_to_dict(declared_contract(family, lora, lora_name or lora.name)) or None
    reason = None
    if family is None:
        reason = "no known model family matches its keys"
    elif contract is None:
        reason = "its name and metadata declare no sampling contract"
    return {"file": lora.name, "family": family.id if family else None, "contract": contract, "reason": reason}
