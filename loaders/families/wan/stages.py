"""Which steps a Wan2.2 stage may run when its model carries distill LoRAs fused into one expert each.

Why: the three-stage Lightning recipe samples one schedule with three samplers (the high-noise expert without
the LoRA at real cfg, then with it at cfg 1, then the low-noise expert with its LoRA). A distill LoRA covers
its expert's part of its table only: a stage whose model carries the high-noise file and runs a step on the
low-noise expert samples that step with an expert that has no distill LoRA, at the distill cfg, on the
distill table: the recipe is broken without any other contract field being wrong. So every step of such a
stage must run on an expert that carries a distill LoRA of the model; a stage without one is free.
"""

from __future__ import annotations

import os
from typing import Optional

from ...contracts.schedule_rules import refuse_or_record
from ..roles import ROLE_HIGH_NOISE, ROLE_LOW_NOISE

_EXPERT_WORDS = {ROLE_HIGH_NOISE: "high-noise", ROLE_LOW_NOISE: "low-noise"}


def check_stage_experts(model_handle, schedule, experts: list, roles: dict, enforce: bool) -> list:
    """ContractError naming the artifact and start_step/end_step when a step of the stage runs an expert
    without a distill LoRA while another expert's is in force; with ``enforce`` off, the override lines."""
    bound = _expert_bound_contracts(model_handle, schedule.contracts, roles)
    if not bound:
        return []
    stage = range(schedule.start_step, schedule.stage_end)
    outside = [step for step in stage if experts[step] not in bound]
    if not outside:
        return []
    allowed = [step for step in range(len(experts)) if experts[step] in bound]
    step = outside[0]
    component, contract = next(iter(bound.items()))
    input_name, fix = _which_input(step, schedule, allowed)
    text = (f"{input_name} {getattr(schedule, input_name) if input_name == 'start_step' else schedule.stage_end} "
            f"runs step {step} (σ={float(schedule.sigmas[step]):.4f}) on {experts[step]}, which carries no distill "
            f"LoRA; {contract.source} covers the {_EXPERT_WORDS[roles[component]]} expert {component} (steps "
            f"{_span(allowed)} of the schedule): {fix}")
    overrides: list = []
    refuse_or_record(contract, text, enforce, overrides)
    return overrides


def _expert_bound_contracts(model_handle, contracts, roles: dict) -> dict:
    """{expert component: first contract} of the contracts fused (or attached) into one expert of the pair."""
    specs = tuple(getattr(model_handle, "fuses", ())) + tuple(getattr(model_handle, "adapters", ()))
    bound = {}
    for contract in contracts:
        component = _component_of(contract.source, specs)
        if component is not None and roles.get(component) in _EXPERT_WORDS and contract.steps is not None:
            bound.setdefault(component, contract)
    return bound


def _component_of(source: str, specs) -> Optional[str]:
    for spec in specs:
        names = {os.path.basename(spec.path.rstrip("/\\")), os.path.basename((spec.name or "").rstrip("/\\"))}
        if source in names:
            return spec.component
    return None


def _which_input(step: int, schedule, allowed: list) -> tuple:
    """(the input that let the step in, what to set it to)."""
    later = [s for s in allowed if s > step]
    if not [s for s in allowed if schedule.start_step <= s < step] and later:
        return "start_step", f"set start_step to {later[0]}"
    return "end_step", f"set end_step to {step}"


def _span(steps: list) -> str:
    return f"{steps[0]}..{steps[-1]}" if steps else "none"
