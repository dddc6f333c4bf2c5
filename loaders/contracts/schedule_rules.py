"""The rules every single-schedule family (Wan, Qwen-Image) resolves its sampling request by.

A run of these families has one sigma list; contracts constrain steps, sigmas, shift and cfg:
- a contract made for another model family is refused (the family says which model families it serves: Wan2.1
  and Wan2.2 count as one);
- two artifacts that constrain the same field differently conflict (error naming both); artifacts that declare
  the same values (a Wan2.2 high+low pair) agree;
- with ``enforce_contract`` the request must match every constrained field; without it the request wins and
  every difference is recorded in ``ResolvedSchedule.overrides``;
- the contract's explicit sigma list is used as is; without contracts, ``sigmas.shifted_sigmas(steps, shift)``.
A family adds its own checks through ``check_resolved`` (Wan2.2: the expert split a distill pair was trained on).
MiniMax-H3 has two schedules and its own resolver (``families/minimax_h3/resolve.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

from ..contract_types import ResolvedSchedule, SamplingRequest, ScheduleContract
from ..errors import ContractError
from .sigmas import shifted_sigmas, slice_offset, validate_schedule

# Fields a Wan/Qwen contract may constrain, in the order they are checked and reported.
_CHECKED_FIELDS = ("steps", "sigmas", "shift", "cfg")
_SIGMA_TOLERANCE = 1e-6
_KIND_NOUNS = {
    "distill": "distill LoRA",
    "turbo": "Turbo adapter",
    "native": "native adapter",
    "pinned": "checkpoint with a pinned schedule",
}
# How an error says where the contract it enforces was read from (ScheduleContract.declared_by).
_DECLARED_BY_WORDS = {
    "file name": "its file name declares this contract",
    "metadata": "its safetensors metadata declares this contract",
    "checkpoint": "the checkpoint's model_index.json pins this schedule",
}


def declared_by_words(contract: ScheduleContract) -> str:
    """"its file name declares this contract; " — the start of an error's parenthesis ("" when unknown)."""
    words = _DECLARED_BY_WORDS.get(contract.declared_by)
    if words is None and contract.declared_by:  # a contract table entry: "lorabind-contracts.json line 3"
        words = f"{contract.declared_by} declares this contract"
    return f"{words}; " if words else ""


def resolve_single_schedule(model, contracts: Sequence[ScheduleContract], request: SamplingRequest, *,
                            serves: Sequence[str], check_resolved: Optional[Callable] = None) -> ResolvedSchedule:
    """Resolve ``request`` against ``contracts`` for ``model`` (a ModelHandle) of a family serving the model
    families ``serves``. ``check_resolved(model, resolved, request, overrides)`` may refuse (ContractError) or
    append overrides. Raises ContractError before anything touches a weight."""
    if request.sigmas is not None:  # a SIGMAS input: its points are the schedule, whatever steps says
        request = replace(request, steps=len(request.sigmas) - 1)
    elif request.steps is not None and request.steps < 1:  # 0: "the step count the contract declares"
        request = replace(request, steps=_contract_steps(contracts, model))
    if not contracts:
        return _plain_schedule(request)
    foreign = _foreign_contracts(model, contracts, serves)
    if foreign and request.enforce_contract:
        raise ContractError(foreign[0])
    agreed, conflicts = _merge_contracts(contracts)
    if conflicts and request.enforce_contract:
        raise ContractError(conflicts[0])
    overrides = [f"{text}; the request's values are used (enforce_contract is off)" for text in foreign + conflicts]
    _check_tasks(contracts, request, overrides)
    resolved = _resolve_against(agreed, contracts, request, overrides)
    if check_resolved is not None:
        check_resolved(model, resolved, request, overrides)
    return replace(resolved, overrides=tuple(overrides))  # overrides is complete only after the family's check


def _contract_steps(contracts: Sequence[ScheduleContract], model) -> int:
    """The step count a request with ``steps=0`` asks for: the first contract's (a disagreeing one is then
    refused as a conflict like any other)."""
    for contract in contracts:
        steps = contract_value(contract, "steps")
        if steps is not None:
            return int(steps)
    raise ContractError(f"steps is 0, which means 'the step count the connected contract declares', but nothing "
                        f"connected to the sampler for {model.model.name} declares one; set steps to a positive "
                        f"number")


def contract_dict(contract: ScheduleContract) -> dict:
    """JSON-able view of a single-schedule contract for node UI output and ``inspect --json``."""
    return {
        "source": contract.source,
        "kind": contract.kind,
        "family": contract.family,
        "steps": contract.steps,
        "sigma_points": len(contract.sigmas) if contract.sigmas is not None else None,
        "sigmas": list(contract.sigmas) if contract.sigmas is not None else None,
        "shift": contract.shift,
        "cfg": contract.cfg,
        "tasks": list(contract.tasks) if contract.tasks else None,
        "open": list(contract.open_fields),
        "scheduler": contract.scheduler,
        "rank": contract.rank,
        "alpha": contract.alpha,
        "scale": contract.scale,
        "declared_by": contract.declared_by,
        "note": contract.note,
        "text": contract.describe(),
    }


def describe_artifact(contract: ScheduleContract) -> str:
    """"X is a 4-step distill LoRA" — the subject of every contract message."""
    noun = _kind_noun(contract)
    steps = contract_value(contract, "steps")
    if steps is None:
        return f"{contract.source} is a {noun}"
    return f"{contract.source} is a {steps}-step {noun}"



def mismatch_message(contract: ScheduleContract, field: str, input_name: str, value, requested) -> str:
    """"X is a 4-step distill LoRA: steps must be 4, got 20 (...)": the refusal of an enforced field, worded
    the same wherever it is found (the sampler, or ``lorabind run`` before anything loads)."""
    return (f"{describe_artifact(contract)}: {input_name} must be {_fmt(field, value)}, got {_fmt(field, requested)} "
            f"({declared_by_words(contract)}set enforce_contract off to override it explicitly)")


def sigma_table(contract: ScheduleContract) -> Optional[tuple]:
    """The contract's sigma points (steps + 1, ending in 0), None when it pins no schedule."""
    if contract.sigmas is not None:
        return tuple(float(s) for s in contract.sigmas)
    steps, shift = contract_value(contract, "steps"), contract.shift
    return shifted_sigmas(int(steps), float(shift)) if steps and shift else None


def contract_value(contract: ScheduleContract, field: str) -> Any:
    """A contract's constraint on one field; explicit sigmas imply their step count."""
    if field == "steps" and contract.steps is None and contract.sigmas is not None:
        return len(contract.sigmas) - 1
    return getattr(contract, field)


# --------------------------------------------------------------------------------------------------------------
# internals


def _plain_schedule(request: SamplingRequest) -> ResolvedSchedule:
    return ResolvedSchedule(
        sigmas=request.sigmas or shifted_sigmas(request.steps, request.shift),
        steps=request.steps,
        cfg=request.cfg,
        shift=request.shift,
        boundary=request.boundary,
        task=request.task,
    )


def _kind_noun(contract: ScheduleContract) -> str:
    return _KIND_NOUNS.get(contract.kind, f"{contract.kind} artifact")


def _foreign_contracts(model, contracts: Sequence[ScheduleContract], serves: Sequence[str]) -> list:
    """Messages for contracts made for another model family (e.g. a MiniMax-H3 schedule wired into a Wan
    sampler: its sigmas and shift mean nothing for this model)."""
    return [
        f"{contract.source} is a {contract.family} {_kind_noun(contract)}; "
        f"its sampling contract does not apply to the {model.family} model {model.model.name}"
        for contract in contracts
        if contract.family and contract.family not in serves
    ]


def _same(field: str, a: Any, b: Any) -> bool:
    if field == "sigmas":
        return len(a) == len(b) and all(abs(float(x) - float(y)) <= _SIGMA_TOLERANCE for x, y in zip(a, b))
    if field == "steps":
        return int(a) == int(b)
    return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-6)


def _fmt(field: str, value: Any) -> str:
    if field == "sigmas":
        return "[" + ", ".join(f"{float(v):g}" for v in value) + "]"
    if field == "steps":
        return str(int(value))
    return f"{float(value):g}"


def _merge_contracts(contracts: Sequence[ScheduleContract]) -> tuple[dict, list]:
    """Per field: (value, first contract declaring it). Conflicting declarations become messages naming both."""
    agreed: dict = {}
    conflicts: list = []
    for field in _CHECKED_FIELDS:
        for contract in contracts:
            value = contract_value(contract, field)
            if value is None:
                continue
            if field not in agreed:
                agreed[field] = (value, contract)
                continue
            first_value, first = agreed[field]
            if not _same(field, first_value, value):
                conflicts.append(
                    f"conflicting sampling contracts: {first.source} requires {field}={_fmt(field, first_value)} "
                    f"but {contract.source} requires {field}={_fmt(field, value)}; remove one of them"
                )
    return agreed, conflicts


def _check_tasks(contracts: Sequence[ScheduleContract], request: SamplingRequest, overrides: list) -> None:
    if request.task is None:
        return
    for contract in contracts:
        if contract.tasks and request.task not in contract.tasks:
            text = f"{describe_artifact(contract)} and serves tasks {list(contract.tasks)}, got task={request.task}"
            if request.enforce_contract:
                raise ContractError(text)
            overrides.append(f"task={request.task} overrides {contract.source} (serves {list(contract.tasks)})")


def _resolve_against(agreed: dict, contracts: tuple, request: SamplingRequest, overrides: list) -> ResolvedSchedule:
    for field, input_name, requested in _requested_fields(request):
        if field not in agreed:
            continue
        value, contract = agreed[field]
        if _same(field, value, requested):
            continue
        if request.enforce_contract:
            raise ContractError(mismatch_message(contract, field, input_name, value, requested))
        overrides.append(
            f"{input_name}={_fmt(field, requested)} overrides {contract.source} "
            f"({field}={_fmt(field, value)} in its contract)"
        )

    steps = request.steps
    shift = float(agreed["shift"][0]) if "shift" in agreed and request.enforce_contract else float(request.shift)
    if request.sigmas is not None:
        _check_given_sigmas(contracts, request, overrides)
    if "cfg" in agreed and request.enforce_contract:
        cfg = float(agreed["cfg"][0])
    else:
        cfg = tuple(map(float, request.cfg)) if isinstance(request.cfg, (tuple, list)) else float(request.cfg)
    sigmas = request.sigmas or _contract_sigmas(agreed, steps, shift)
    if "sigmas" in agreed and request.sigmas is None and not _same("sigmas", agreed["sigmas"][0], sigmas):
        value, contract = agreed["sigmas"]
        overrides.append(
            f"sigmas={_fmt('sigmas', sigmas)} override {contract.source} (sigmas={_fmt('sigmas', value)} in its "
            f"contract)"
        )
    return ResolvedSchedule(
        sigmas=sigmas,
        steps=steps,
        cfg=cfg,
        shift=shift,
        boundary=request.boundary,
        task=request.task,
        contracts=tuple(contracts),
    )

def _requested_fields(request: SamplingRequest) -> list:
    """(contract field, sampler input name, requested value): a per-expert cfg pair is checked value by value,
    so a contract's cfg=1 binds both Wan2.2 experts and the error names the input that differs."""
    fields = [("steps", "steps", request.steps), ("shift", "shift", request.shift)] if request.sigmas is None else []
    if isinstance(request.cfg, (tuple, list)):
        high, low = request.cfg
        return fields + [("cfg", "cfg", high), ("cfg", "cfg_low_noise", low)]
    return fields + [("cfg", "cfg", request.cfg)]


def _check_given_sigmas(contracts: Sequence[ScheduleContract], request: SamplingRequest, overrides: list) -> None:
    """A SIGMAS input under a contract must be a contiguous part of the contract's table (a stage of it, within
    the float32 noise of ComfyUI's sigma nodes); anything else is refused naming the artifact."""
    for contract in contracts:
        table = sigma_table(contract)
        if table is None or slice_offset(table, request.sigmas) is not None:
            continue
        text = (f"the sigmas input {_fmt('sigmas', request.sigmas)} is no part of its "
                f"{contract_value(contract, 'steps')}-step table {_fmt('sigmas', table)}")
        refuse_or_record(contract, text, request.enforce_contract, overrides, declared_by_words(contract))


def refuse_or_record(contract: ScheduleContract, text: str, enforce: bool, overrides: list, fix: str = "") -> None:
    """An enforced contract refuses ``text`` (ContractError naming the artifact, ``fix`` and how to override it);
    with enforce_contract off the difference is recorded in ``overrides`` instead, never silent."""
    if enforce:
        raise ContractError(f"{describe_artifact(contract)}: {text} ({fix}set enforce_contract off to override it "
                            f"explicitly)")
    overrides.append(f"{text}; overrides {contract.source}")


def _contract_sigmas(agreed: dict, steps: int, shift: float) -> tuple:
    """The contract's explicit list when it fits the (possibly overridden) steps and shift, else the shifted grid."""
    if "sigmas" in agreed:
        value, contract = agreed["sigmas"]
        try:
            explicit = validate_schedule(value, contract.source)
        except ValueError as exc:
            raise ContractError(str(exc)) from None
        shift_agrees = "shift" not in agreed or _same("shift", agreed["shift"][0], shift)
        if len(explicit) - 1 == steps and shift_agrees:
            return explicit
    return shifted_sigmas(steps, shift)
