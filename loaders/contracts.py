"""Sampling contracts: collect, enforce, resolve (placeholder: no contracts yet, plain shifted schedule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .sigmas import shifted_sigmas


@dataclass(frozen=True)
class SamplingRequest:
    steps: int
    cfg: float
    shift: float
    boundary: Optional[float] = None
    task: Optional[str] = None
    audio_shift: Optional[float] = None
    enforce_contract: bool = True


@dataclass(frozen=True)
class ResolvedSchedule:
    sigmas: tuple
    steps: int
    cfg: float
    shift: float
    boundary: Optional[float] = None
    task: Optional[str] = None
    audio_sigmas: Optional[tuple] = None
    contracts: tuple = ()
    overrides: tuple = ()


def resolve_schedule(model, adapters, schedule, request: SamplingRequest) -> ResolvedSchedule:
    return ResolvedSchedule(
        sigmas=shifted_sigmas(request.steps, request.shift),
        steps=request.steps,
        cfg=request.cfg,
        shift=request.shift,
        boundary=request.boundary,
        task=request.task,
    )
