"""``sample``: resolve the contract, check the inputs, bind the branch's LoRA state, denoise, report.

Why a use case: the order is the rule. Everything that can refuse a run (the sampling contracts of every
artifact, inputs that cannot be sampled together, options a model does not have) is checked before ``bind``
writes a single weight, and every host (the sampler node inside ComfyUI or headless) runs it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..loaders import binding, generation
from ..loaders.contracts import SamplingRequest, contract_to_dict, resolve_schedule
from ..loaders.families import family_for, has_expert_pair


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


def schedule_report(model, schedule) -> dict:
    """The resolved schedule as JSON for the UI: what actually runs, step by step."""
    family = family_for(model)
    return {
        "steps": schedule.steps,
        "sigmas": [float(s) for s in schedule.sigmas],
        "audio_sigmas": [float(s) for s in schedule.audio_sigmas] if schedule.audio_sigmas else None,
        "shift": schedule.shift,
        "cfg": list(schedule.cfg) if isinstance(schedule.cfg, (tuple, list)) else schedule.cfg,
        "boundary": family.effective_boundary(model, schedule),
        "task": schedule.task,
        "experts": family.experts_per_step(model, schedule),  # None: the denoiser follows the task
        "contracts": [contract_to_dict(c) for c in schedule.contracts],
        "overrides": list(schedule.overrides),
        "notes": list(schedule.notes),  # why this schedule ran, when another was declared too
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


def sample(model, positive, negative, latent, options: SampleOptions, *, adapter=None, schedule=None,
           on_step: Optional[Callable[[int, int], None]] = None, on_bind: Optional[Callable] = None,
           check_interrupt: Optional[Callable[[], None]] = None) -> tuple:
    """(denoised latent, resolved schedule, report dict) for one sampler run of a model handle."""
    _check_options(model, options)
    cfg = (options.cfg, options.cfg_low_noise) if options.cfg_low_noise else options.cfg
    request = SamplingRequest(steps=options.steps, cfg=cfg, shift=options.shift, boundary=options.boundary or None,
                              task=generation.implied_task(model.model, latent),
                              audio_shift=options.audio_flow_shift or None, enforce_contract=options.enforce_contract)
    resolved = resolve_schedule(model, adapter, schedule, request)
    generation.check_inputs(model.model, positive, negative, latent, resolved)
    adapters = model.adapters + (adapter.adapters if adapter is not None else ())
    bind_report = binding.bind(model.model, model.fuses, adapters, check_interrupt=check_interrupt,
                               on_progress=on_bind)
    samples = generation.denoise(model.model, positive, negative, latent, resolved, options.seed,
                                 on_step=on_step, check_interrupt=check_interrupt)
    placement = model.model.placement
    report = {**schedule_report(model.model, resolved), "bind": bind_report.to_dict(),
              "placement": placement.describe() if placement is not None else None}
    return samples, resolved, report
