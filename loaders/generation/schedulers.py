"""Step rules over an explicit sigma list: our flow-matching Euler, or diffusers' multistep flow schedulers.

Why diffusers' schedulers and not our own: UniPC and DPM++ are what the reference pipelines sample non-distilled
models with (Wan's ``scheduler_config.json`` names UniPC), and their solver maths (predictor/corrector, order
warm-up, lower-order final steps) is diffusers'. Why the override after ``set_timesteps``: their ``sigmas``
argument re-shifts custom sigmas and appends its own terminal 0 (``diffusers-feasibility.md`` §2), which breaks
a contract's table and any stage that stops above 0. So each scheduler is set up for the step count and then
handed our points verbatim, with the two conventions its own ``set_timesteps`` applies: the first sigma moved
1e-6 below 1 (their log(1 − σ) would be infinite) and integer timesteps ``floor(σ·1000)``, which the model is
evaluated at as in the pipelines. Euler stays ours: it is the same update as ``FlowMatchEulerDiscreteScheduler``
(``x += (σ_{i+1} − σ_i)·v``) at the exact timestep ``σ·1000`` the distill LoRAs were trained on.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from ..errors import ContractError
from .sampling import LatentCallback, denoised, euler

DEFAULT = "default"  # the contract's pinned scheduler, else the family's reference one
EULER = "euler"
# name -> (diffusers class, its configuration for flow-matching velocity models)
_DIFFUSERS = {
    "unipc": ("UniPCMultistepScheduler", {"prediction_type": "flow_prediction", "use_flow_sigmas": True,
                                          "solver_order": 2, "solver_type": "bh2", "flow_shift": 1.0}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"prediction_type": "flow_prediction", "use_flow_sigmas": True,
                                                 "algorithm_type": "dpmsolver++", "solver_order": 2,
                                                 "flow_shift": 1.0}),
}
SCHEDULERS = (EULER, *_DIFFUSERS)
CHOICES = (DEFAULT, *SCHEDULERS)
_FIRST_SIGMA_GUARD = 1e-6  # diffusers' UniPC/DPM++ set_timesteps: sigma 1 would make log(alpha) infinite
_TIMESTEP_SLACK = 1e-4  # float32 sigma noise (~6e-8 x 1000) must not move floor(σ·1000) down by one


def resolve_scheduler(requested: str, contracts: Sequence, family_default: str, enforce: bool) -> tuple:
    """(scheduler name, override lines): ``default`` takes what a contract pins, else the family's reference
    scheduler; a request for another scheduler than a contract pins is refused naming the artifact (or, with
    ``enforce`` off, recorded as an override)."""
    if requested not in CHOICES:
        raise ValueError(f"scheduler must be one of {list(CHOICES)}, got {requested!r}")
    pinned = [c for c in contracts if getattr(c, "scheduler", None)]
    if requested == DEFAULT:
        return (pinned[0].scheduler if pinned else family_default), []
    overrides = []
    for contract in (c for c in pinned if c.scheduler != requested):
        text = f"scheduler={requested} overrides {contract.source} (sampled with {contract.scheduler} by its publisher)"
        if enforce:
            raise ContractError(f"{contract.source} is sampled with scheduler {contract.scheduler} by its publisher: "
                                f"scheduler must be {contract.scheduler} or default, got {requested} (set "
                                f"enforce_contract off to override it explicitly)")
        overrides.append(text)
    return requested, overrides


def make_scheduler(name: str, config: Optional[dict] = None):
    """The diffusers scheduler ``name`` stands for: the pipeline's own configuration when it is that class
    (``config``: its ``scheduler.config``), else our flow-matching defaults."""
    import diffusers

    class_name, defaults = _DIFFUSERS[name]
    cls = getattr(diffusers, class_name)
    if config is not None and config.get("_class_name") == class_name:
        return cls.from_config({**dict(config), "use_flow_sigmas": True, "prediction_type": "flow_prediction"})
    return cls(**defaults)


def step_over(x: torch.Tensor, sigmas: Sequence[float], velocity: Callable, name: str, *, config=None,
              on_step=None, on_latent: Optional[LatentCallback] = None, check_interrupt=None) -> torch.Tensor:
    """Run ``velocity(i, x, sigma)`` over ``sigmas`` with the step rule ``name`` (see the module docstring);
    ``on_step`` / ``on_latent`` as ``sampling.euler`` calls them."""
    if name == EULER:
        return euler(x, sigmas, velocity, on_step=on_step, on_latent=on_latent, check_interrupt=check_interrupt)
    scheduler = make_scheduler(name, config)
    points = over_explicit_sigmas(scheduler, sigmas)
    total = len(points) - 1
    with torch.no_grad():
        for i in range(total):
            if check_interrupt is not None:
                check_interrupt()
            timestep = scheduler.timesteps[i]
            v = velocity(i, x, float(timestep) / 1000.0).to(x.device)
            if on_latent is not None:
                on_latent(i + 1, total, denoised(x, points[i], v))
            x = scheduler.step(v, timestep, x, return_dict=False)[0]
            if on_step is not None:
                on_step(i + 1, total)
    return x


def over_explicit_sigmas(scheduler, sigmas: Sequence[float]) -> list:
    """Set ``scheduler`` up for ``sigmas`` verbatim (but for diffusers' own first-sigma guard); its points."""
    points = [float(s) for s in sigmas]
    if points[0] > 1.0 - _FIRST_SIGMA_GUARD:
        points[0] = 1.0 - _FIRST_SIGMA_GUARD
    scheduler.set_timesteps(num_inference_steps=len(points) - 1)  # resets the multistep state
    scheduler.sigmas = torch.tensor(points, dtype=torch.float32)
    scheduler.timesteps = torch.tensor([math.floor(p * 1000.0 + _TIMESTEP_SLACK) for p in points[:-1]],
                                       dtype=torch.int64)
    scheduler.set_begin_index(0)
    return points
