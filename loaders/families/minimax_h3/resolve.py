"""Resolve a MiniMax-H3 sampling request against the active contracts (Turbo, native, checkpoint-pinned).

Why here and not in the generic resolver: a MiniMax-H3 request has two schedules (video, audio), a task that
selects one of two DiT partitions, and contracts whose "steps" count intervals of an explicit ``base_schedule``.
Every rule is checked BEFORE any weight is touched; each violation names the artifact and the field. With
``enforce_contract=False`` each violation is recorded in ``overrides`` and the request's value is used instead.
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

from ...contract_types import ResolvedSchedule, SamplingRequest, ScheduleContract
from ...contracts.sigmas import shift_schedule, shifted_sigmas
from ...errors import ContractError
from .contracts import (
    DEFAULT_TASK,
    FAMILY_ID,
    PARTITION_BY_TASK,
    TASKS,
    checkpoint_shifts,
    step_count_words,
)


def _is_off(contract: ScheduleContract) -> bool:
    """An adapter at scale 0 contributes nothing, so it neither constrains the task nor imposes its schedule."""
    return contract.scale is not None and math.isclose(contract.scale, 0.0, abs_tol=1e-12)


def _extra(contract: ScheduleContract, key: str):
    return dict(contract.extra).get(key)


def _omitted(value) -> bool:
    return value is None or value <= 0


class _Checks:
    """Collects violations: raise at once when enforcing, else record each as an explicit override."""

    def __init__(self, enforce: bool):
        self.enforce = enforce
        self.overrides: list[str] = []

    def violation(self, message: str) -> None:
        if self.enforce:
            raise ContractError(message)
        self.overrides.append(f"{message} (overridden: enforce_contract is off)")


def _requested_task(contracts: Sequence[ScheduleContract], request: SamplingRequest) -> str:
    task = request.task or next((_extra(c, "task") for c in contracts if _extra(c, "task")), None) or DEFAULT_TASK
    if task not in TASKS:
        raise ContractError(f"MiniMax-H3 task={task!r} is not one of {list(TASKS)}")
    return task


def _check_task_and_partition(contract, task, partition, model_handle, checks: _Checks) -> None:
    if task not in contract.tasks:
        if contract.kind == "turbo":
            family = _extra(contract, "task_family") or "MiniMax-H3"
            checks.violation(
                f"{contract.source} is a {family} Turbo artifact and serves tasks {list(contract.tasks)}, "
                f"got task={task!r}"
            )
        else:
            checks.violation(f"{contract.source} supports tasks {list(contract.tasks)} only, got task={task!r}")
    if contract.partition != partition:
        checks.violation(
            f"{contract.source} binds to the {contract.partition} partition, but task={task!r} runs on {partition}"
        )
    # the file may reach the model as a dynamic adapter (MiniMaxTurboSchedule) or as a fuse (FuseDistillLoRA,
    # whose component defaults to transformer): either way its weights must land on the partition it serves
    attached = [(spec.component, "attached to") for spec in getattr(model_handle, "adapters", ())
                if os.path.basename(spec.path) == contract.source]
    attached += [(spec.component, "fused into") for spec in getattr(model_handle, "fuses", ())
                 if os.path.basename(spec.path) == contract.source]
    for component, verb in attached:
        if component != contract.partition:
            checks.violation(
                f"{contract.source} is {verb} {component}, but its contract binds it to {contract.partition} "
                f"(the partition that runs {', '.join(contract.tasks)})"
            )


def _schedule_owner(active: list, task: str, model_name: str) -> tuple[Optional[ScheduleContract], tuple]:
    """The one contract whose schedule the run uses, and why it won when another declared one too.

    An active native adapter's ``base_schedule`` overrides the checkpoint's pinned one (the vllm-omni MiniMax-H3
    guide: "when active the adapter schedule overrides the base checkpoint"); any other two different schedules on
    one run are a conflict.
    """
    pinned = [c for c in active if c.kind == "pinned" and task in (c.tasks or ())]
    natives = [c for c in active if c.kind == "native"]
    turbos = [c for c in active if c.kind == "turbo"]
    notes: tuple = ()
    if natives and pinned:
        notes = (
            f"schedule of {natives[0].source} (native LoRA, base_schedule {list(natives[0].base_schedule)}) "
            f"overrides {pinned[0].source}'s pinned base_schedule {list(pinned[0].base_schedule)}: an active native "
            f"adapter's own schedule wins over the checkpoint's",
        )
        pinned = []
    owners = turbos + natives + pinned
    for other in owners[1:]:
        first = owners[0]
        same = (first.steps, first.sigmas, first.audio_sigmas, first.base_schedule) == (
            other.steps,
            other.sigmas,
            other.audio_sigmas,
            other.base_schedule,
        )
        if not same:
            raise ContractError(
                f"{first.source} ({first.kind}, {first.steps} steps) and {other.source} ({other.kind}, "
                f"{other.steps} steps) declare different sampling schedules for one {model_name} run; "
                f"activate only one of them (or set one adapter's scale to 0)"
            )
    return (owners[0] if owners else None), notes


def _steps_message(owner: ScheduleContract, requested: int) -> str:
    n = owner.steps
    if owner.kind == "turbo":
        return (
            f"{owner.source} is {step_count_words(n)} artifact and requires steps={n} ({n + 1} sigma points produce "
            f"{n} denoiser evaluations), got steps={requested}"
        )
    if owner.kind == "pinned":
        return (
            f"{owner.source} pins a distilled sigma schedule (base_schedule {list(owner.base_schedule)}); steps must "
            f"be {n} or omitted, got {requested}: steps counts intervals, and its {n + 1} sigma points produce {n} "
            f"denoiser evaluations"
        )
    if requested == n + 1:
        return (
            f"{owner.source} uses the distilled interval-count contract: steps must be {n} or omitted, not "
            f"{n + 1}. Its base_schedule has {n + 1} sigma points, i.e. {n} intervals = {n} denoiser evaluations"
        )
    return (
        f"{owner.source} requires steps={n} (one denoiser evaluation per base_schedule interval) or omitted, "
        f"got steps={requested}"
    )


def _shift(owner_shift: float, requested, owner_name: str, field: str, checks: _Checks) -> float:
    if _omitted(requested) or math.isclose(float(requested), owner_shift, rel_tol=1e-9):
        return owner_shift
    checks.violation(f"{owner_name} requires {field}={owner_shift:g}, got {field}={float(requested):g}")
    return float(requested)


def resolve(contracts: Sequence[ScheduleContract], request: SamplingRequest, model_handle) -> ResolvedSchedule:
    """Video + audio sigma lists for a MiniMax-H3 run; ContractError on the first violated rule."""
    model = model_handle.model
    checks = _Checks(request.enforce_contract)
    video_default, audio_default = checkpoint_shifts(model.model_index)
    active = [c for c in contracts if c.family == FAMILY_ID and not _is_off(c)]
    task = _requested_task(active, request)
    partition = PARTITION_BY_TASK[task]
    if partition not in model.components:
        wanted_by = [c.source for c in active if c.kind in ("turbo", "native") and task in (c.tasks or ())]
        raise ContractError(
            f"{model.name} has no {partition} partition, which task={task!r} runs on"
            + (f" (the task {', '.join(wanted_by)} serves)" if wanted_by else "")
        )
    for contract in active:
        if contract.kind in ("turbo", "native"):
            _check_task_and_partition(contract, task, partition, model_handle, checks)
    owner, notes = _schedule_owner(active, task, model.name)

    requested_steps = None if _omitted(request.steps) else int(request.steps)
    if owner is None:
        if requested_steps is None:
            raise ContractError(f"{model.name}: steps must be at least 1 (no contract supplies a schedule)")
        steps = requested_steps
        video_shift = video_default if _omitted(request.shift) else float(request.shift)
        audio_shift = audio_default if _omitted(request.audio_shift) else float(request.audio_shift)
        base = None
    else:
        steps = owner.steps
        if requested_steps is not None and requested_steps != owner.steps:
            checks.violation(_steps_message(owner, requested_steps))
            steps = requested_steps
        owner_video = owner.shift if owner.shift is not None else video_default
        owner_audio = owner.audio_shift if owner.audio_shift is not None else audio_default
        video_shift = _shift(owner_video, request.shift, owner.source, "flow_shift", checks)
        audio_shift = _shift(owner_audio, request.audio_shift, owner.source, "audio_flow_shift", checks)
        base = owner.base_schedule if steps == owner.steps else None
    if base is not None:
        sigmas, audio_sigmas = shift_schedule(base, video_shift), shift_schedule(base, audio_shift)
    else:
        sigmas, audio_sigmas = shifted_sigmas(steps, video_shift), shifted_sigmas(steps, audio_shift)
    return ResolvedSchedule(
        sigmas=sigmas,
        steps=steps,
        cfg=request.cfg,
        shift=video_shift,
        boundary=None,
        task=task,
        audio_sigmas=audio_sigmas,
        contracts=tuple(active),
        overrides=tuple(checks.overrides),
        notes=notes,
    )
