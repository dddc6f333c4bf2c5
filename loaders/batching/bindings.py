"""Which part of each request's LoRA state a batch fuses for all its rows, and which it applies to a request's own
rows only.

A request's binding is its fuses (FuseSpec, at this step's strength) and active adapters (AdapterSpec). Requests
on one model fall into groups: those whose specs that cannot run per row (full diffs, LoKr, DoRA, norm and
modulation diffs: every spec of a distill pair with ``diff`` tensors; everything under tensor parallelism) are
the same. A group's *base* is fused (or activated) for the whole batch; every other spec of a member is a plain
low-rank pair on linear layers, added to that member's rows only (``row_lora``). So a distill pair shared by
everyone stays fused while each user's style LoRA runs on its own rows, and two different distill pairs never
share a batch: the engine re-binds between their groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ..binding.bind import main_denoiser, prepared_targets
from ..handles import FuseSpec
from ..io.file_identity import file_identity
from ..lora.kinds.low_rank import LowRankDelta


def spec_key(spec) -> tuple:
    """Two specs with one key change the model the same way (the display name is not part of it)."""
    amount = spec.strength if isinstance(spec, FuseSpec) else spec.scale
    return type(spec).__name__, os.path.realpath(spec.path), spec.component, float(amount), bool(spec.lenient)


@dataclass(frozen=True)
class Binding:
    """One request's LoRA state at its current step; ``exclusive`` when it changes from step to step (a strength
    schedule): such a request shares no batch, since each step would re-bind the others' weights too."""

    fuses: tuple = ()
    adapters: tuple = ()
    exclusive: bool = False
    keys: dict = field(default=None, compare=False)  # spec_key -> spec, filled in by ``bound``

    @classmethod
    def bound(cls, fuses, adapters, exclusive: bool = False) -> "Binding":
        adapters = tuple(a for a in adapters if float(a.scale))  # scale 0 is off: never bound
        keys = {spec_key(spec): spec for spec in (*fuses, *adapters)}
        return cls(tuple(fuses), adapters, exclusive, keys)

    def only(self, keys) -> "Binding":
        """This binding restricted to ``keys`` (the specs a batch fuses for everyone)."""
        return Binding.bound([s for s in self.fuses if spec_key(s) in keys],
                             [s for s in self.adapters if spec_key(s) in keys])


class RowForms:
    """Whether a spec can run on a request's own rows, and as what: ``((component, module path, LowRankDelta),
    ...)``, or None. Cached per model, spec and file version."""

    def __init__(self):
        self._known: dict = {}
        self._refused: dict = {}  # id(model) -> why its layers take no per-row products (a batch found out)

    def refuse(self, model, reason: str) -> None:
        self._refused[id(model)] = reason

    def of(self, model, spec) -> Optional[tuple]:
        if id(model) in self._refused:
            return None
        key = (id(model), spec_key(spec), _version(spec.path))  # a file rewritten in place is a new version
        if key not in self._known:
            if len(self._known) > 4096:
                self._known.clear()
            self._known[key] = _row_form(model, spec)
        return self._known[key]

    def fixed_keys(self, model, binding: Binding) -> frozenset:
        """The specs of ``binding`` that must be fused (or activated) for every row of a batch."""
        return frozenset(key for key, spec in binding.keys.items() if self.of(model, spec) is None)


def _row_form(model, spec) -> Optional[tuple]:
    if getattr(spec, "strength_schedule", None) is not None or getattr(model, "tensor_parallel", ()):
        return None
    component = model.components[spec.component or main_denoiser(model)]
    parts = []
    for path, target in prepared_targets(model, spec).items():
        weight = getattr(component.get_submodule(path), "weight", None)
        if not _plain_pair(target) or weight is None or weight.dim() != 2:
            return None
        parts.append((path, target.low_rank))
    return tuple(parts)


def _plain_pair(target) -> bool:
    """A target that is one plain low-rank pair of matrices and nothing else (no full diff of any parameter)."""
    delta = target.low_rank
    return (not target.param_diffs and isinstance(delta, LowRankDelta) and delta.down.dim() == 2
            and delta.up.dim() == 2)


def file_runs_per_row(lora) -> bool:
    """Whether a read LoRA file (``LoraFile``) could run on a request's own rows on any model: plain low-rank
    pairs only. What a front routes by before any model is loaded (``serve --ray``: such a file is not part of
    the binding a replica must hold)."""
    return bool(lora.targets) and all(_plain_pair(target) for target in lora.targets.values())


def _version(path: str) -> tuple:
    try:
        return file_identity(path)
    except OSError:  # gone: prepared_targets names the file when it is read
        return ()


def amount(spec) -> float:
    """How much of its delta a spec adds: a fuse's strength or an adapter's scale."""
    return float(spec.strength if isinstance(spec, FuseSpec) else spec.scale)
