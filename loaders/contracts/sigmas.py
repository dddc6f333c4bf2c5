"""Flow-matching sigma schedules.

Why our own: diffusers' schedulers shift *custom* sigmas again and append the terminal 0 themselves
(``diffusers-feasibility.md`` §2), so a contract's exact sigma list cannot be passed through them unchanged.
Contracts here are stated as explicit sigma lists: ``steps`` denoiser evaluations = ``steps + 1`` points,
the last one 0.0.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..contract_types import MAX_STEPS, MIN_SHIFT


def shift_sigma(u: float, shift: float) -> float:
    """Rectified-flow time shift ``s(u) = k·u / (1 + (k − 1)·u)``."""
    return shift * u / (1.0 + (shift - 1.0) * u)


def check_shift(shift, field: str = "shift") -> float:
    """``shift`` as a float when a schedule can be built with it: finite and at least ``MIN_SHIFT`` (ValueError
    naming ``field`` otherwise, never a division by zero further down)."""
    try:
        value = float(shift)
    except OverflowError:  # an integer with hundreds of digits
        value = math.inf
    if not (math.isfinite(value) and value >= MIN_SHIFT):
        raise ValueError(f"{field} must be a finite number of at least {MIN_SHIFT:g} (the flow-matching time "
                         f"shift), got {value:g}")
    return value


def shifted_sigmas(steps: int, shift: float) -> tuple[float, ...]:
    """``steps + 1`` points: the uniform grid ``u_i = 1 − i/steps`` shifted by ``shift``, ending in 0.0."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    shift = check_shift(shift)
    return tuple(shift_sigma(1.0 - i / steps, shift) for i in range(steps)) + (0.0,)


def shift_schedule(points: Sequence[float], shift: float) -> tuple[float, ...]:
    """Shift every point of an explicit base schedule (e.g. a checkpoint-pinned one) by ``shift``."""
    shift = check_shift(shift)
    return tuple(shift_sigma(float(p), shift) for p in points)


def on_high_noise_expert(sigma: float, boundary: float) -> bool:
    """Wan2.2 MoE: a step runs on the high-noise expert when its timestep ``σ·1000`` is at least
    ``boundary·1000`` (the pipeline's rule, compared on the timestep scale as the pipeline does)."""
    return sigma * 1000.0 >= boundary * 1000.0


# A schedule has at most one point more than the steps a sampler runs; a longer list (a 10^6-point SIGMAS input)
# is refused before its values are read, and messages quote a few values, not the list.
MAX_POINTS = MAX_STEPS + 1


def shown(values: Sequence[float]) -> str:
    """A schedule in a message: every value of a short one, the ends of a long one with its length."""
    if len(values) <= 6:
        return str([float(v) for v in values])
    ends = ", ".join(f"{float(v):g}" for v in values[:3]) + ", ..., " + ", ".join(f"{float(v):g}" for v in values[-2:])
    return f"[{ends}] ({len(values)} points)"


def _bounded_floats(points: Sequence[float], source: str) -> tuple[float, ...]:
    if len(points) > MAX_POINTS:
        raise ValueError(f"{source}: {len(points)} sigma points, over the {MAX_POINTS} of the most steps a sampler "
                         f"runs ({MAX_STEPS})")
    values = tuple(float(p) for p in points)
    bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
    if bad is not None:
        raise ValueError(f"{source}: sigma point {bad} is {values[bad]}, a non-finite value ({shown(values)})")
    return values


def validate_schedule(points: Sequence[float], source: str) -> tuple[float, ...]:
    """A schedule must be finite, start at 1.0, end at 0.0 and strictly decrease. ``source`` names the artifact."""
    values = _bounded_floats(points, source)
    if len(values) < 2:
        raise ValueError(f"{source}: a schedule needs at least 2 sigma points, got {shown(values)}")
    if values[0] != 1.0 or values[-1] != 0.0:
        raise ValueError(f"{source}: schedule {shown(values)} must start at 1.0 and end at 0.0")
    if any(b >= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{source}: schedule {shown(values)} must be strictly decreasing")
    return values


# How far a sampled sigma may be from a contract's published table. ComfyUI builds its flow-model sigma table in
# float32 from 1000 training timesteps (ModelSamplingSD3: sigma(t/1000) shifted) and its "simple" scheduler picks
# every (1000/steps)-th entry: the published points up to float32 rounding (~1e-7; measured at 4 steps, shift 5:
# [1, 0.9375, 0.83333, 0.625, 0]). Its other schedulers are other schedules: "sgm_uniform" spaces from the
# table's last entry (t = 1/1000) and lands up to 4.6e-3 off ([1, 0.93789, 0.83471, 0.62963, 0]); "normal" and
# "beta" differ by 0.1 or more. 1e-4 keeps float32 noise in and those out, as well as any other step count or
# shift (the nearest neighbours of the lightx2v table, 5 steps or shift 4, are more than 1e-2 away).
TABLE_TOLERANCE = 1e-4


def sigmas_close(got: Sequence[float], wanted: Sequence[float]) -> bool:
    """Same points within ``TABLE_TOLERANCE`` (and at least one step)."""
    return len(got) == len(wanted) and len(got) > 1 and all(
        math.isfinite(float(a)) and abs(float(a) - float(b)) <= TABLE_TOLERANCE for a, b in zip(got, wanted))


def slice_offset(table: Sequence[float], sigmas: Sequence[float]):
    """The step of ``table`` where ``sigmas`` starts when it is a contiguous part of it, else None."""
    return next((start for start in range(len(table) - len(sigmas) + 1)
                 if sigmas_close(sigmas, table[start:start + len(sigmas)])), None)


def switch_step(table: Sequence[float], boundary: float) -> int:
    """The first step the low-noise expert runs (its sigma below ``boundary``); len(steps) when none does."""
    steps = list(table[:-1])
    return next((i for i, sigma in enumerate(steps) if not on_high_noise_expert(sigma, boundary)), len(steps))


def check_run_sigmas(points: Sequence[float], source: str) -> tuple[float, ...]:
    """Sigmas a sampler is handed (ComfyUI SIGMAS, a slice of a schedule): 2 to ``MAX_POINTS`` finite points in
    [0, 1], strictly decreasing. Unlike a contract's full schedule they need not start at 1 or end at 0 (a stage)."""
    values = _bounded_floats(points, source)
    if len(values) < 2:
        raise ValueError(f"{source}: needs at least 2 sigma points (1 step), got {shown(values)}")
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"{source}: every sigma must be a number in 0..1, got {shown(values)}")
    if any(b >= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{source}: sigmas {shown(values)} must be strictly decreasing")
    return values
