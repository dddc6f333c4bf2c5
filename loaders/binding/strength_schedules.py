"""Strength schedules: a LoRA's strength that changes from step to step of one sampler run.

Why: people fade a distill or style LoRA in or out over the schedule (kijai's wrapper takes one strength per step,
ComfyUI has hook keyframes). A schedule holds *multipliers* of the node's strength (or scale), so one schedule
fits both LoRAs of a Wan2.2 pair and a schedule of 1s is the plain strength exactly. The multipliers are written
either one per step (``"1, 0.75, 0.5, 0.25"``) or as keyframes ``step:value`` interpolated linearly between them
and held before the first and after the last (``"0:1, 3:0"``).

Between steps nothing new is invented: ``StrengthStepper`` calls the ordinary ``bind`` with the next step's
strengths, so an adapter only changes its scale in place and a fused LoRA re-patches only its own layers (the
patcher rewrites exactly the parameters whose contributions changed, each from its original, rounded once). The
binding after every step, and after the run, is therefore exactly a fresh bind at that step's strengths.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .bind import bind

MAX_SCHEDULE_CHARS = 20_000  # a widget's text: bounds the parse (one value per step of a 10 000-step run)
MAX_SCHEDULE_STEP = 10_000  # the sampler's own step bound
MAX_MULTIPLIER = 10.0  # as the strength widgets' range
_STEP = re.compile(r"[0-9]{1,6}")


@dataclass(frozen=True)
class StrengthSchedule:
    """Parsed multipliers: ``per_step`` (one per step of the run) or ``keyframes`` ((step, value), steps rising)."""

    per_step: tuple = ()
    keyframes: tuple = ()

    def describe(self) -> str:
        if self.per_step:
            return ", ".join(f"{v:g}" for v in self.per_step)
        return ", ".join(f"{s}:{v:g}" for s, v in self.keyframes)

    def multipliers(self, steps: int, label: str) -> list:
        """The multiplier of each of the run's ``steps`` steps; ValueError naming ``label`` when they do not fit."""
        if self.per_step:
            if len(self.per_step) != steps:
                raise ValueError(f"{label}: strength_schedule gives {len(self.per_step)} strengths but the schedule "
                                 f"has {steps} steps: give one per step, or keyframes 'step:strength'")
            return list(self.per_step)
        last_step = self.keyframes[-1][0]
        if last_step >= steps:
            raise ValueError(f"{label}: strength_schedule has a keyframe at step {last_step} but the schedule has "
                             f"{steps} steps (0 to {steps - 1})")
        return [_interpolated(self.keyframes, step) for step in range(steps)]


def parse_strength_schedule(text: str, where: str) -> Optional[StrengthSchedule]:
    """A widget's text as a schedule (None when empty); ValueError naming ``where`` (node and input) otherwise."""
    text = (text or "").strip()
    if not text:
        return None
    if len(text) > MAX_SCHEDULE_CHARS:
        raise ValueError(f"{where}: strength_schedule is longer than {MAX_SCHEDULE_CHARS} characters")
    entries = [entry.strip() for entry in text.replace("\n", ",").split(",") if entry.strip()]
    keyed = [":" in entry for entry in entries]
    if any(keyed) and not all(keyed):
        raise ValueError(f"{where}: strength_schedule mixes plain strengths and 'step:strength' keyframes "
                         f"({text[:80]!r}): use one form")
    if not all(keyed):
        return StrengthSchedule(per_step=tuple(_value(entry, where) for entry in entries))
    keyframes = [_keyframe(entry, where) for entry in entries]
    steps = [step for step, _ in keyframes]
    if steps != sorted(set(steps)):
        raise ValueError(f"{where}: strength_schedule keyframe steps must rise, each once (got {steps[:20]})")
    return StrengthSchedule(keyframes=tuple(keyframes))


def _value(entry: str, where: str) -> float:
    try:
        value = float(entry)
    except ValueError:
        raise ValueError(f"{where}: strength_schedule entry {entry[:40]!r} is not a number") from None
    if not math.isfinite(value) or abs(value) > MAX_MULTIPLIER:
        raise ValueError(f"{where}: strength_schedule value {entry[:40]!r} must be a finite number within "
                         f"±{MAX_MULTIPLIER:g}")
    return value


def _keyframe(entry: str, where: str) -> tuple:
    step_text, value_text = entry.split(":", 1)
    # ASCII digits only: str.isdigit() also accepts "²", which int() then refuses with a bare error
    if not _STEP.fullmatch(step_text.strip()) or int(step_text) > MAX_SCHEDULE_STEP:
        raise ValueError(f"{where}: strength_schedule keyframe {entry[:40]!r} needs a step from 0 to "
                         f"{MAX_SCHEDULE_STEP} before the ':'")
    return int(step_text), _value(value_text.strip(), where)


def _interpolated(keyframes: Sequence[tuple], step: int) -> float:
    """Linear between the keyframes around ``step``; the first value before the first, the last after the last."""
    if step <= keyframes[0][0]:
        return keyframes[0][1]
    for (s0, v0), (s1, v1) in zip(keyframes, keyframes[1:]):
        if step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return keyframes[-1][1]


def _label(spec) -> str:
    return spec.name or spec.path


def _strength_of(spec) -> float:
    """A FuseSpec's strength or an AdapterSpec's scale."""
    return spec.strength if hasattr(spec, "strength") else spec.scale


class StrengthStepper:
    """The strengths of every fuse and adapter at each step of a run, and the bind that moves between them.

    Built (and so checked against the step count) before the first weight is written; ``bind_step`` binds only
    when a strength actually changes, so an unscheduled run binds exactly once, as before."""

    def __init__(self, fuses: Sequence, adapters: Sequence, steps: int):
        self.fuses, self.adapters = tuple(fuses), tuple(adapters)
        self._fuse_factors = [self._factors(spec, steps) for spec in self.fuses]
        self._adapter_factors = [self._factors(spec, steps) for spec in self.adapters]
        self._bound_step: Optional[tuple] = None

    @staticmethod
    def _factors(spec, steps: int) -> Optional[list]:
        schedule = spec.strength_schedule
        return None if schedule is None else schedule.multipliers(steps, _label(spec))

    @property
    def scheduled(self) -> bool:
        return any(f is not None for f in self._fuse_factors + self._adapter_factors)

    def specs_at(self, step: int) -> tuple:
        """(fuses, adapters) with the strengths of ``step``: the node's strength times the step's multiplier."""
        fuses = [spec if f is None else dataclasses.replace(spec, strength=spec.strength * f[step])
                 for spec, f in zip(self.fuses, self._fuse_factors)]
        adapters = [spec if f is None else dataclasses.replace(spec, scale=spec.scale * f[step])
                    for spec, f in zip(self.adapters, self._adapter_factors)]
        return fuses, adapters

    def bind_step(self, model, step: int, **bind_options):
        """Bind ``model`` to the strengths of ``step`` (the ordinary incremental, transactional bind); None when
        they equal the ones already bound."""
        fuses, adapters = self.specs_at(step)
        wanted = (tuple(f.strength for f in fuses), tuple(a.scale for a in adapters))
        if wanted == self._bound_step:
            return None
        report = bind(model, fuses, adapters, **bind_options)
        self._bound_step = wanted
        return report

    def report(self) -> list:
        """Per scheduled LoRA: name, component, schedule and its strength at each step (the sampler's UI output)."""
        return [{"name": _label(spec), "component": spec.component, "schedule": spec.strength_schedule.describe(),
                 "strengths": [_strength_of(spec) * factor for factor in factors]}
                for spec, factors in zip(self.fuses + self.adapters, self._fuse_factors + self._adapter_factors)
                if factors is not None]

    def rebinding_after_step(self, model, start_step: int, on_step: Optional[Callable], **bind_options):
        """An ``on_step(done, total)`` for the denoise loop that, after each step but the last, binds the next
        step's strengths, then reports progress as ``on_step`` did."""
        return self.after_each_step(start_step, on_step, lambda step: self.bind_step(model, step, **bind_options))

    def after_each_step(self, start_step: int, on_step: Optional[Callable], next_step: Callable[[int], None]):
        """An ``on_step(done, total)`` that hands ``next_step`` the run's next step number after each step but the
        last (where the next strengths take over: a bind here, the step engine's request elsewhere), then
        reports progress as ``on_step`` did."""

        def after_step(done: int, total: int) -> None:
            if done < total:
                next_step(start_step + done)
            if on_step is not None:
                on_step(done, total)

        return after_step
