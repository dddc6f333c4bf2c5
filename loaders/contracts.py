"""Sampling contracts: collect them from the handles, enforce them, resolve the sampling schedule.

Why this exists: a step-distilled LoRA (lightx2v 4-step, Qwen-Image Lightning) or a checkpoint that pins its
schedule only produces the quality it was trained for on exactly one schedule. ComfyUI and diffusers let users
sample such artifacts at 20 steps / cfg 5 and silently get bad output. Here every artifact states its contract
(``ScheduleContract``) and the sampler asks ``resolve_schedule`` for the sigmas *before* any weight changes, so a
mismatch is a clear error naming the artifact and the field, and an override is an explicit, recorded choice.

Rules (Wan / Qwen-Image; MiniMax-H3 has its own resolver, ``families.minimax_h3.resolve_schedule``):
- contracts come from the model handle (checkpoint-pinned, fuses), the adapter handle and the schedule input;
  an artifact applied at strength/scale 0 is off and declares nothing;
- a contract made for another model family is refused (Wan2.1 and Wan2.2 count as one family);
- two artifacts that constrain the same field differently conflict (error naming both); artifacts that declare
  the same values (a Wan2.2 high+low pair) agree;
- with ``enforce_contract`` the request must match every constrained field; without it the request wins and
  every difference is recorded in ``ResolvedSchedule.overrides``;
- the contract's explicit sigma list is used as is; without contracts, ``sigmas.shifted_sigmas(steps, shift)``;
- on Wan2.2 MoE an explicit ``boundary`` may not change a Wan2.2 contract's expert split (the model's
  ``boundary_ratio`` on the contract sigmas: 2 high-noise + 2 low-noise steps for lightx2v 4-step).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from .errors import ContractError
from .handles import ScheduleContract
from .sigmas import on_high_noise_expert, shifted_sigmas, validate_schedule


@dataclass(frozen=True)
class SamplingRequest:
    """What the user asked the sampler for (node widgets). ``boundary`` None = the model's own boundary.
    ``cfg`` is one value, or a (high-noise, low-noise) pair for the two Wan2.2 experts."""

    steps: int
    cfg: Any
    shift: float
    boundary: Optional[float] = None
    task: Optional[str] = None
    audio_shift: Optional[float] = None
    enforce_contract: bool = True


@dataclass(frozen=True)
class ResolvedSchedule:
    """The schedule the sampler runs: ``steps`` denoiser evaluations over ``steps + 1`` sigma points."""

    sigmas: tuple
    steps: int
    cfg: Any  # one value, or the request's (high-noise, low-noise) pair
    shift: float
    boundary: Optional[float] = None
    task: Optional[str] = None
    audio_sigmas: Optional[tuple] = None
    contracts: tuple = ()
    overrides: tuple = ()


# Fields a Wan/Qwen contract may constrain, in the order they are checked and reported.
_CHECKED_FIELDS = ("steps", "sigmas", "shift", "cfg")
_SIGMA_TOLERANCE = 1e-6
_KIND_NOUNS = {
    "distill": "distill LoRA",
    "turbo": "Turbo adapter",
    "native": "native adapter",
    "pinned": "checkpoint with a pinned schedule",
}


def resolve_schedule(model, adapters, schedule, request: SamplingRequest) -> ResolvedSchedule:
    """Collect, check and resolve. ``model`` is a ModelHandle, ``adapters`` an AdapterHandle or None,
    ``schedule`` a ScheduleHandle or None. Raises ContractError before anything touches a weight."""
    contracts = collect_contracts(model, adapters, schedule)
    if model.family == "minimax_h3":
        from .families import minimax_h3

        return minimax_h3.resolve_schedule(contracts, request, model)
    if not contracts:
        return _plain_schedule(request)
    foreign = _foreign_contracts(model, contracts)
    if foreign and request.enforce_contract:
        raise ContractError(foreign[0])
    agreed, conflicts = _merge_contracts(contracts)
    if conflicts and request.enforce_contract:
        raise ContractError(conflicts[0])
    overrides = [f"{text}; the request's values are used (enforce_contract is off)" for text in foreign + conflicts]
    _check_tasks(contracts, request, overrides)
    resolved = _resolve_against(agreed, contracts, request, overrides)
    _check_expert_split(model, resolved, request, overrides)
    return replace(resolved, overrides=tuple(overrides))  # overrides is complete only after the expert check


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

    MiniMax-H3 contracts have their own keys (``flow_shift``, ``audio_flow_shift``, ``base_schedule``...), so
    every caller gets the right view for any family from here."""
    if contract is None:
        return {}
    if contract.family == "minimax_h3":
        from .families import minimax_h3

        return {**minimax_h3.contract_dict(contract), "text": minimax_h3.describe_contract(contract)}
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
        "rank": contract.rank,
        "alpha": contract.alpha,
        "scale": contract.scale,
        "text": contract.describe(),
    }


def describe_artifact(contract: ScheduleContract) -> str:
    """"X is a 4-step distill LoRA" — the subject of every contract message."""
    noun = _kind_noun(contract)
    steps = _contract_value(contract, "steps")
    if steps is None:
        return f"{contract.source} is a {noun}"
    return f"{contract.source} is a {steps}-step {noun}"


# --------------------------------------------------------------------------------------------------------------
# internals


def _plain_schedule(request: SamplingRequest) -> ResolvedSchedule:
    return ResolvedSchedule(
        sigmas=shifted_sigmas(request.steps, request.shift),
        steps=request.steps,
        cfg=request.cfg,
        shift=request.shift,
        boundary=request.boundary,
        task=request.task,
    )


def _kind_noun(contract: ScheduleContract) -> str:
    return _KIND_NOUNS.get(contract.kind, f"{contract.kind} artifact")


def _family_group(family: str) -> str:
    """Wan2.1 and Wan2.2 share the schedule space (a Wan2.1 distill LoRA on a Wan2.2 expert is common use)."""
    return "wan" if family in ("wan2.1", "wan2.2_moe") else family


def _foreign_contracts(model, contracts: Sequence[ScheduleContract]) -> list:
    """Messages for contracts made for another model family (e.g. a MiniMax-H3 schedule wired into a Wan
    sampler: its sigmas and shift mean nothing for this model)."""
    return [
        f"{contract.source} is a {contract.family} {_kind_noun(contract)}; "
        f"its sampling contract does not apply to the {model.family} model {model.model.name}"
        for contract in contracts
        if contract.family and _family_group(contract.family) != _family_group(model.family)
    ]


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


def _contract_value(contract: ScheduleContract, field: str) -> Any:
    """A contract's constraint on one field; explicit sigmas imply their step count."""
    if field == "steps" and contract.steps is None and contract.sigmas is not None:
        return len(contract.sigmas) - 1
    return getattr(contract, field)


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
            value = _contract_value(contract, field)
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
            raise ContractError(
                f"{describe_artifact(contract)}: {input_name} must be {_fmt(field, value)}, "
                f"got {_fmt(field, requested)} (set enforce_contract off to override it explicitly)"
            )
        overrides.append(
            f"{input_name}={_fmt(field, requested)} overrides {contract.source} "
            f"({field}={_fmt(field, value)} in its contract)"
        )

    steps = request.steps
    shift = float(agreed["shift"][0]) if "shift" in agreed and request.enforce_contract else float(request.shift)
    if "cfg" in agreed and request.enforce_contract:
        cfg = float(agreed["cfg"][0])
    else:
        cfg = tuple(map(float, request.cfg)) if isinstance(request.cfg, (tuple, list)) else float(request.cfg)
    sigmas = _contract_sigmas(agreed, steps, shift)
    if "sigmas" in agreed and not _same("sigmas", agreed["sigmas"][0], sigmas):
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


def _check_expert_split(model, resolved: ResolvedSchedule, request: SamplingRequest, overrides: list) -> None:
    """A Wan2.2 distill pair is trained on a fixed expert split (lightx2v 4-step: 2 high-noise + 2 low-noise
    steps, reference §2.9), which the model's own ``boundary_ratio`` gives on the contract's sigmas. An explicit
    ``boundary`` input that moves a step to the other expert breaks the contract like a wrong step count."""
    model_boundary = getattr(model.model, "model_index", {}).get("boundary_ratio")
    if model.family != "wan2.2_moe" or request.boundary is None or model_boundary is None:
        return
    split_by = [c for c in resolved.contracts if c.family == "wan2.2_moe" and _contract_value(c, "sigmas")]
    if not split_by:
        return
    steps = [float(s) for s in resolved.sigmas[:-1]]
    wanted = sum(on_high_noise_expert(s, float(model_boundary)) for s in steps)
    got = sum(on_high_noise_expert(s, float(request.boundary)) for s in steps)
    if wanted == got:
        return
    text = (f"boundary={request.boundary:g} runs {got} of {len(steps)} steps on the high-noise expert, but the "
            f"model's boundary_ratio {float(model_boundary):g} runs {wanted}")
    if request.enforce_contract:
        raise ContractError(f"{describe_artifact(split_by[0])}: {text} (set boundary to 0 to use the model's, or "
                            f"enforce_contract off to override it explicitly)")
    overrides.append(f"{text}; overrides {split_by[0].source}")


def _requested_fields(request: SamplingRequest) -> list:
    """(contract field, sampler input name, requested value): a per-expert cfg pair is checked value by value,
    so a contract's cfg=1 binds both Wan2.2 experts and the error names the input that differs."""
    fields = [("steps", "steps", request.steps), ("shift", "shift", request.shift)]
    if isinstance(request.cfg, (tuple, list)):
        high, low = request.cfg
        return fields + [("cfg", "cfg", high), ("cfg", "cfg_low_noise", low)]
    return fields + [("cfg", "cfg", request.cfg)]


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
