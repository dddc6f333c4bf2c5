"""The data types of sampling contracts: what an artifact declares, what a sampler asks, what runs.

Why a leaf module (it imports nothing of ours): handles, the contract resolvers and every model family use these
types, and the families also implement the resolvers; keeping the types here means none of them has to import
another to name a type, so the package has no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# ScheduleContract.kind of a file whose metadata says it has no contract although its name suggests one: it
# constrains nothing, and exists so the override is shown wherever contracts are.
NO_CONTRACT = "none"
# ScheduleContract.declared_by values that are part of the artifact itself (anything else names a contract table)
OWN_DECLARATIONS = ("file name", "metadata", "checkpoint")
# The most steps a sampler runs (its steps input's maximum). A contract that declares more could never run, and
# reading its words would build a sigma table of that size, so it is refused where the words are parsed.
MAX_STEPS = 1000
# The smallest flow-matching time shift a schedule is built with. The shift s(u) = k·u / (1 + (k - 1)·u) divides
# by 1 + (k - 1)·u, which reaches 0 at u = 1 for k = 0 and rounds to 0 for any k below float64's epsilon
# (1e-300 - 1 == -1.0): "division by zero" deep in a resolver. Published shifts are 1 to 17; a thousandth is far
# below them and far above that rounding.
MIN_SHIFT = 1e-3


@dataclass(frozen=True)
class ScheduleContract:
    """A sampling contract declared by an artifact (distill LoRA, Turbo/native adapter, pinned checkpoint).

    ``steps`` counts denoiser evaluations (intervals); ``sigmas`` holds steps + 1 points ending in 0.0.
    Fields left ``None`` are not constrained by this contract.
    """

    source: str  # artifact name used in every error message (file name or model folder name)
    kind: str  # "distill", "turbo", "native", "pinned"
    family: str  # "wan2.1", "wan2.2_moe", "qwen_image", "minimax_h3"
    steps: Optional[int] = None
    sigmas: Optional[tuple[float, ...]] = None
    shift: Optional[float] = None
    cfg: Optional[float] = None
    audio_sigmas: Optional[tuple[float, ...]] = None
    audio_shift: Optional[float] = None
    tasks: Optional[tuple[str, ...]] = None
    partition: Optional[str] = None
    base_schedule: Optional[tuple[float, ...]] = None
    alpha: Optional[float] = None
    rank: Optional[int] = None
    scale: Optional[float] = None
    extra: tuple[tuple[str, Any], ...] = ()
    # Where the contract was read from: "file name", "metadata" (the file's safetensors metadata) or "checkpoint"
    # (the model's model_index.json). Shown wherever the contract is, so a surprising one can be traced.
    declared_by: str = ""
    note: str = ""  # e.g. the file name suggested another contract than its metadata declares (metadata wins)
    # Fields the artifact's release leaves to the user (a distill file whose name carries no step count): shown
    # with the contract, so "steps open" is a statement about the file, not a contract that was missed.
    open_fields: tuple[str, ...] = ()
    # The step rule the artifact is sampled with by its publisher ("euler": the distill LoRAs); None = free.
    scheduler: Optional[str] = None

    def describe(self) -> str:
        """One line in words, for UI badges and logs."""
        parts = [f"{self.source}: {'no contract' if self.kind == NO_CONTRACT else self.kind}"]
        if self.steps is not None:
            parts.append(f"steps={self.steps}")
        if self.shift is not None:
            parts.append(f"shift={self.shift:g}")
        if self.audio_shift is not None:
            parts.append(f"audio_shift={self.audio_shift:g}")
        if self.cfg is not None:
            parts.append(f"cfg={self.cfg:g}")
        if self.tasks:
            parts.append("tasks=" + ",".join(self.tasks))
        if self.open_fields:
            parts.append(", ".join(self.open_fields) + " open")
        text = " ".join(parts)
        if self.declared_by:  # "its file name" / "its metadata", or a table line, which is not the file's own
            whose = "its " if self.declared_by in OWN_DECLARATIONS else ""
            text += f" (declared by {whose}{self.declared_by})"
        return f"{text}; {self.note}" if self.note else text


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
    # A connected SIGMAS input: the schedule as given (steps and shift are then not asked for); a contract takes
    # it when it is a contiguous part of the contract's table.
    sigmas: Optional[tuple] = None


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
    notes: tuple = ()  # why this schedule ran when several were declared (e.g. a native adapter over a pinned one)
    # The stage of ``sigmas`` this sampler runs: steps ``start_step`` .. ``end_step - 1`` (None: to the end).
    # A stage that stops before the last point leaves a noisy latent for the next sampler to continue.
    start_step: int = 0
    end_step: Optional[int] = None
    add_noise: bool = True  # False: the latent already is the noise state at the stage's first sigma
    scheduler: str = "euler"  # the step rule (loaders.generation.schedulers)

    @property
    def stage_end(self) -> int:
        return self.steps if self.end_step is None else min(self.end_step, self.steps)

    def stage_sigmas(self) -> tuple:
        """The sigma points this stage runs: ``stage_end - start_step`` steps."""
        return tuple(self.sigmas[self.start_step:self.stage_end + 1])
