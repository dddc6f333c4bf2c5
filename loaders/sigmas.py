"""Flow-matching sigma schedules.

Why our own: diffusers' schedulers shift *custom* sigmas again and append the terminal 0 themselves
(``diffusers-feasibility.md`` §2), so a contract's exact sigma list cannot be passed through them unchanged.
Contracts here are stated as explicit sigma lists: ``steps`` denoiser evaluations = ``steps + 1`` points,
the last one 0.0.
"""

from __future__ import annotations

import math
from typing import Sequence


def shift_sigma(u: float, shift: float) -> float:
    """Rectified-flow time shift ``s(u) = k·u / (1 + (k − 1)·u)``."""
    return shift * u / (1.0 + (shift - 1.0) * u)


def shifted_sigmas(steps: int, shift: float) -> tuple[float, ...]:
    """``steps + 1`` points: the uniform grid ``u_i = 1 − i/steps`` shifted by ``shift``, ending in 0.0."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    return tuple(shift_sigma(1.0 - i / steps, shift) for i in range(steps)) + (0.0,)


def shift_schedule(points: Sequence[float], shift: float) -> tuple[float, ...]:
    """Shift every point of an explicit base schedule (e.g. a checkpoint-pinned one) by ``shift``."""
    return tuple(shift_sigma(float(p), shift) for p in points)


def on_high_noise_expert(sigma: float, boundary: float) -> bool:
    """Wan2.2 MoE: a step runs on the high-noise expert when its timestep ``σ·1000`` is at least
    ``boundary·1000`` (the pipeline's rule, compared on the timestep scale as the pipeline does)."""
    return sigma * 1000.0 >= boundary * 1000.0


def validate_schedule(points: Sequence[float], source: str) -> tuple[float, ...]:
    """A schedule must be finite, start at 1.0, end at 0.0 and strictly decrease. ``source`` names the artifact."""
    values = tuple(float(p) for p in points)
    if len(values) < 2:
        raise ValueError(f"{source}: a schedule needs at least 2 sigma points, got {list(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{source}: schedule {list(values)} has a non-finite value")
    if values[0] != 1.0 or values[-1] != 0.0:
        raise ValueError(f"{source}: schedule {list(values)} must start at 1.0 and end at 0.0")
    if any(b >= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{source}: schedule {list(values)} must be strictly decreasing")
    return values
