"""``sample``: resolve the contract, check the inputs, bind the branch's LoRA state, denoise, report.

Why a use case: the order is the rule. Everything that can refuse a run (the sampling contracts of every
artifact, inputs that cannot be sampled together, options a model does not have) is checked before ``bind``
writes a single weight, and every host (the sampler node inside ComfyUI or headless) runs it the same way.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ..loaders.batching.engine import installed as installed_engine
from ..loaders.binding.bind import binding_state
from ..loaders.binding.sharded_deltas import local_part
from ..loaders.binding.strength_schedules import StrengthStepper
from ..loaders.contracts.sigmas import check_run_sigmas, switch_step
from ..loaders.dispatch import generation_steps as generation
from ..loaders.dispatch.contract_discovery import SamplingRequest, collect_contracts, contract_to_dict, resolve_schedule
from ..loaders.distributed.cfg_parallel import unsplit_note
from ..loaders.distributed.fingerprints import check_same_binding
from ..loaders.distributed.process_group import session_spec
from ..loaders.families import family_for, has_expert_pair
from ..loaders.generation import schedulers
from .engine_sampling import denoise_in_engine

# end_step's "to the end of the schedule" (KSamplerAdvanced's end_at_step default)
END_OF_SCHEDULE = 10000
SCHEDULER_CHOICES = schedulers.CHOICES


@dataclass(frozen=True)
class SampleOptions:
    """The sampler's inputs besides the handles: 0 / None means "the model's or the contract's own"."""

    seed: int
    steps: int
    cfg: float
    shift: float
    boundary: float = 0.0
    enforce_contract: bool = True
    cfg_low_noise: float = 0.0
    audio_flow_shift: float = 0.0
    # stages: a SIGMAS input (None: steps + shift or the contract), the slice of it this sampler runs,
    # KSampler's denoise (the last steps of a longer schedule) and whether noise is added to the latent first
    sigmas: Optional[tuple] = None
    start_step: int = 0
    end_step: int = END_OF_SCHEDULE
    denoise: float = 1.0
    add_noise: bool = True
    scheduler: str = schedulers.EULER  # what every run used before the choice existed ("default": the family's)

    @property
    def is_staged(self) -> bool:
        return (self.sigmas is not None or self.start_step != 0 or self.end_step != END_OF_SCHEDULE
                or self.denoise != 1.0 or not self.add_noise or self.scheduler not in
                (schedulers.DEFAULT, schedulers.EULER))


def schedule_report(model, schedule) -> dict:
    """The resolved schedule as JSON for the UI: what actually runs, step by step."""
    family = family_for(model)
    return {
        "steps": schedule.steps,
        "sigmas": [float(s) for s in schedule.sigmas],
        "audio_sigmas": [float(s) for s in schedule.audio_sigmas] if schedule.audio_sigmas else None,
        "shift": schedule.shift,
        "cfg": list(schedule.cfg) if isinstance(schedule.cfg, (tuple, list)) else schedule.cfg,
        "boundary": family.sampling.effective_boundary(model, schedule),
        "task": schedule.task,
        "experts": family.sampling.experts_per_step(model, schedule),  # None: the denoiser follows the task
        "contracts": [contract_to_dict(c) for c in schedule.contracts],
        "overrides": list(schedule.overrides),
        "notes": list(schedule.notes),  # why this schedule ran, when another was declared too
        "scheduler": schedule.scheduler,
        "start_step": schedule.start_step,
        "end_step": schedule.stage_end,
        "add_noise": schedule.add_noise,
    }


def _check_options(model, options: SampleOptions) -> None:
    """Options a model does not have are refused by name (a set value would otherwise be silently ignored)."""
    for name, value in (("cfg_low_noise", options.cfg_low_noise), ("boundary", options.boundary)):
        if value and not has_expert_pair(model):
            raise ValueError(f"{name} is only for Wan2.2 MoE models (two experts); {model.model.name} is "
                             f"{model.family}: set {name} to 0")
    if options.audio_flow_shift and not family_for(model).has_audio:
        raise ValueError(f"audio_flow_shift is only for MiniMax-H3 models; {model.model.name} is {model.family}: "
                         "set audio_flow_shift to 0")
    if options.is_staged and not family_for(model).runs_stages:
        raise ValueError(f"sigmas, start_step, end_step, denoise, add_noise and scheduler are not available for "
                         f"{model.family} models ({model.model.name} samples two schedules together): leave them "
                         "at their defaults")
    if not 0.0 < options.denoise <= 1.0:
        raise ValueError(f"denoise must be in (0, 1], got {options.denoise:g}")
    if options.denoise < 1.0 and (options.sigmas is not None or options.start_step or options.steps < 1
                                  or options.end_step != END_OF_SCHEDULE):
        raise ValueError("denoise below 1 runs the last steps of a longer schedule; it cannot be combined with a "
                         "sigmas input, start_step/end_step or steps 0: use one or the other")


def _request(model, latent, options: SampleOptions) -> SamplingRequest:
    """The contract request: with denoise < 1 the schedule is ``int(steps / denoise)`` long (ComfyUI's
    KSampler rule) and the stage is its last ``steps`` steps."""
    cfg = (options.cfg, options.cfg_low_noise) if options.cfg_low_noise else options.cfg
    steps = int(options.steps / options.denoise) if options.denoise < 1.0 else options.steps
    sigmas = check_run_sigmas(options.sigmas, "sigmas input") if options.sigmas is not None else None
    return SamplingRequest(steps=steps, cfg=cfg, shift=options.shift, boundary=options.boundary or None,
                           task=generation.implied_task(model.model, latent), audio_shift=options.audio_flow_shift
                           or None, enforce_contract=options.enforce_contract, sigmas=sigmas)


def _staged(model, resolved, options: SampleOptions):
    """The resolved schedule with this sampler's stage and step rule; refused by name when the stage is empty."""
    start = resolved.steps - options.steps if options.denoise < 1.0 else options.start_step
    if not 0 <= start < min(options.end_step, resolved.steps):
        raise ValueError(f"start_step {start} and end_step {options.end_step} leave no step to run of the "
                         f"{resolved.steps}-step schedule: start_step must be below end_step and the step count")
    family = family_for(model)
    name, overrides = schedulers.resolve_scheduler(options.scheduler, resolved.contracts,
                                                   family.reference_scheduler, options.enforce_contract)
    staged = replace(resolved, start_step=start, end_step=min(options.end_step, resolved.steps),
                     add_noise=options.add_noise, scheduler=name)
    overrides += family.contracts.check_stage(model, staged, options.enforce_contract)
    return replace(staged, overrides=resolved.overrides + tuple(overrides))


@dataclass(frozen=True)
class SamplingPlan:
    """What ``sample`` settles before binding a weight: the resolved (and staged) schedule, already checked
    against the inputs, and its UI report.

    Why a plan: it is a pure function of the handles (immutable, compared by identity) and of the options other
    than the seed, so a sampler keeps its last plan and a seed-only rerun skips contract resolution, staging,
    the input checks and the report (a quarter of the runtime's own work on such a rerun of the tiny model).
    Every run is still held to every contract: a plan is reused only for the very handles and options it was
    checked against, and no contract names a seed. The handles are held weakly: a kept plan must not keep a
    model the graph has let go of in memory."""

    handles: tuple  # weak references (None for an absent optional input)
    options: dict  # the options' fields but the seed
    resolved: object
    schedule_report: dict

    def made_from(self, handles: tuple, options: dict) -> bool:
        if self.options != options:
            return False
        for ref, handle in zip(self.handles, handles):  # a loop, not all(...): asked twice per run, in cold caches
            if (handle is not None) if ref is None else (ref() is not handle):
                return False
        return True


def _seedless(options: SampleOptions) -> dict:
    """The fields a plan depends on (all but the seed); a dict, cheaper to build and compare than a replace()."""
    return {**vars(options), "seed": None}


def plan_sampling(model, positive, negative, latent, options: SampleOptions, *, adapter=None, schedule=None,
                  reuse: Optional[SamplingPlan] = None) -> SamplingPlan:
    """The plan of this run: ``reuse`` when it was made from the same handles and options (any seed), else a new
    one; everything that can refuse the run is checked here, before any weight is bound."""
    handles, seedless = (model, positive, negative, latent, adapter, schedule), _seedless(options)
    if reuse is not None and reuse.made_from(handles, seedless):
        return reuse
    _check_options(model, options)
    resolved = resolve_schedule(model, adapter, schedule, _request(model, latent, options))
    if family_for(model).runs_stages:
        resolved = _staged(model, resolved, options)
    generation.check_inputs(model.model, positive, negative, latent, resolved)
    return SamplingPlan(tuple(None if h is None else weakref.ref(h) for h in handles), seedless, resolved,
                        schedule_report(model.model, resolved))


def sample(model, positive, negative, latent, options: SampleOptions, *, adapter=None, schedule=None,
           on_step: Optional[Callable[[int, int], None]] = None, on_bind: Optional[Callable] = None,
           check_interrupt: Optional[Callable[[], None]] = None, plan: Optional[SamplingPlan] = None,
           on_latent: Optional[Callable] = None) -> tuple:
    """(denoised latent, resolved schedule, report dict) for one sampler run of a model handle; ``plan``: one the
    caller made or kept from its last run, reused when it still applies (``plan_sampling``); ``on_latent``: each
    step's clean-latent estimate, for a live preview (``generation_steps.denoise``)."""
    plan = plan_sampling(model, positive, negative, latent, options, adapter=adapter, schedule=schedule, reuse=plan)
    resolved = plan.resolved
    adapters = model.adapters + (adapter.adapters if adapter is not None else ())
    strengths = StrengthStepper(model.fuses, adapters, resolved.steps)  # a schedule that does not fit: refused
    engine, batching = installed_engine(), None
    if engine is not None:  # served: the engine binds and batches this run's forwards with other requests'
        samples, bind_report, batching = denoise_in_engine(
            engine, model, positive, negative, latent, resolved, options.seed, strengths, on_step=on_step,
            on_latent=on_latent, on_bind=on_bind, check_interrupt=check_interrupt)
    else:
        bind_report = strengths.bind_step(model.model, resolved.start_step, check_interrupt=check_interrupt,
                                          on_progress=on_bind)
        if strengths.scheduled:  # between steps: the next step's strengths, through the same incremental bind
            on_step = strengths.rebinding_after_step(model.model, resolved.start_step, on_step,
                                                     check_interrupt=check_interrupt)
        check_ranks_bound_alike(model.model, adapters)
        samples = generation.denoise(model.model, positive, negative, latent, resolved, options.seed,
                                     on_step=on_step, on_latent=on_latent, check_interrupt=check_interrupt)
    placement = model.model.placement
    warnings = [*family_for(model).sampling.run_warnings(model.model), *filter(None, [unsplit_note(resolved.cfg)])]
    report = {**plan.schedule_report, "warnings": warnings,
              "bind": bind_report.to_dict(),
              "strength_schedules": strengths.report(),
              "placement": placement.describe() if placement is not None else None,
              "tensor_parallel": [r.to_dict() for r in getattr(model.model, "tensor_parallel", ())]}
    if batching is not None and batching["max_batch"] > 1:
        report["batching"] = batching
    return samples, resolved, report


def check_ranks_bound_alike(loaded, adapters) -> None:
    """In a parallel job every rank has just bound the same patches, or the run stops naming the rank(s) that
    did not (``distributed.fingerprints``: made once per change of the binding, compared in one gather); nothing
    to compare in a single process. Served, the step engine calls it after each batch's bind (a parallel job's
    hosts pass it as the engine's ``after_bind``). Under tensor parallelism each rank holds other rows of the split weights by
    design, so only what every rank holds alike is compared there."""
    if not session_spec().is_parallel:
        return
    state = binding_state(loaded)
    patch_set = [("fuse", os.path.basename(f.path), f.component, float(f.strength)) for f in state.fuses]
    patch_set += [("adapter", os.path.basename(a.path), a.component, float(a.scale)) for a in adapters]
    check_same_binding(state, patch_set, lambda: _held_alike(state.patcher))


def _held_alike(patcher) -> list:
    """(name, tensor) of the patched tensors every rank holds whole: all of them, less tensor-parallel shards."""
    held = []
    for name, tensor in patcher.patched_tensors():
        local, shard = local_part(tensor)
        if shard is None:
            held.append((name, local))
    return held


def schedule_sigmas(model, steps: int, shift: float, *, adapter=None, schedule=None, enforce: bool = True):
    """The ResolvedSchedule a sampler with these steps and shift would run on ``model`` (its contracts checked
    as the sampler checks them: a steps/shift mismatch is refused by name), for the sigma node."""
    contracts = collect_contracts(model, adapter, schedule)
    cfg = next((c.cfg for c in contracts if c.cfg is not None), 1.0)  # the sigma node asks no guidance
    request = SamplingRequest(steps=steps, cfg=cfg, shift=shift, enforce_contract=enforce)
    return family_for(model).contracts.resolve_schedule(model, contracts, request)


def split_sigmas(sigmas, step: int, boundary: float) -> tuple:
    """(first part, second part, split step): ComfyUI's SplitSigmas at ``step`` (both parts share that point),
    or at the first sigma below ``boundary`` when it is above 0 (the Wan2.2 expert switch)."""
    points = check_run_sigmas(sigmas, "sigmas input")
    at = switch_step(points, boundary) if boundary > 0 else step
    if not 0 < at < len(points) - 1:
        where = f"boundary {boundary:g}" if boundary > 0 else f"step {step}"
        raise ValueError(f"splitting {len(points) - 1} steps at {where} leaves an empty part: the split must fall "
                         f"between step 1 and step {len(points) - 2}")
    return points[:at + 1], points[at:], at
