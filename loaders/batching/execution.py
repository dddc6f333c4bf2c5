"""Running one batch on the engine's thread: bind the base, stack, one forward with each request's own LoRAs on
its rows, split, check, deliver. What breaks a batch is raised to the engine, which runs its requests again one
at a time (``StepEngine._failed``), so a request whose inputs break the forward fails alone.
"""

from __future__ import annotations

import time

import torch

from ..binding.bind import bind, main_denoiser
from ..errors import LoraBindError
from ..generation.forward_route import direct_forward
from .bindings import amount
from .row_lora import RowLora, RowTerms
from .stacking import rows_of, split, stack


class NonFiniteOutput(LoraBindError):
    """The denoiser gave a request NaN or infinite values: its inputs or its LoRAs' strengths are out of range."""


class BatchRunner:
    """The engine's hands: what the model holds now, and the per-row LoRA hooks."""

    def __init__(self, engine):
        self.engine = engine
        self.row_lora = RowLora()
        self.last_component = None
        self._bound: dict = {}  # id(model) -> the spec keys bound now (after the last successful bind)

    def needs_rebind(self, call) -> bool:
        request = call.request
        group = request.group
        base = self.engine.groups.base_of(group, self.engine.members(group) or [request])
        return self._bound.get(id(request.model)) != base

    def run(self, chosen) -> None:
        """Run one ``plans.Chosen`` batch under the device turn; raises what broke it (the engine decides what
        then: each request again on its own, or, on a follower, rank 0's next plan)."""
        with self.engine.device.held():
            self._run(chosen.calls, chosen.base, chosen.whole)

    def _run(self, batch: list, base_keys: frozenset, whole: bool) -> None:
        """``whole``: the request's whole binding is bound (a lone forward whose inputs do not stack, or a request
        run on its own after its batch failed), so nothing is applied per row."""
        first, lead = batch[0].request, batch[0]
        model, component = first.model, lead.component
        report = self._bind(model, first.binding.only(base_keys), batch)
        if len(batch) == 1:
            inputs, counts = lead.inputs, [0 if whole else rows_of(lead.rule, lead.inputs)]
        else:
            inputs, counts = stack(lead.rule, [call.inputs for call in batch])
        rows = {} if whole else self._row_terms(model, batch, base_keys, counts)
        with self.row_lora.applied(model.components[component], rows, sum(counts) if rows else 0):
            output = direct_forward(model, component, inputs)
        outputs = [output] if len(batch) == 1 else split(output, counts)
        self.last_component = component
        for call, own in zip(batch, outputs):
            self._deliver(call, own, report, len(batch))

    def _bind(self, model, base, batch: list):
        """The model bound to ``base`` (a ``Binding``); a lone request's bind reports progress to it and may be
        interrupted by it, as its own bind would be."""
        request = batch[0].request
        alone = len(batch) == 1
        options = {}
        if alone:
            options = {"check_interrupt": lambda: request.in_context(request.check_interrupt),
                       "on_progress": lambda done, total: request.in_context(request.on_bind, done, total)}
        report = bind(model, base.fuses, base.adapters, **options)
        self._bound[id(model)] = frozenset(base.keys)
        if self.engine.after_bind is not None:
            self.engine.after_bind(model, base)
        return report

    def _row_terms(self, model, batch: list, base_keys: frozenset, counts: list) -> dict:
        """{module path: [RowTerms]} of each member's specs outside the base (every one a row form)."""
        by_path: dict = {}
        start = 0
        for call, rows in zip(batch, counts):
            request = call.request
            own = [spec for key, spec in request.binding.keys.items() if key not in base_keys]
            terms: dict = {}
            for spec in own:
                if (spec.component or main_denoiser(model)) != call.component:
                    continue
                for path, delta in self.engine.groups.row_forms.of(model, spec):
                    terms.setdefault(path, []).append((delta, amount(spec)))
                request.batching.row_applied.add(spec.name or spec.path)
            stop = start + rows
            for path, deltas in terms.items():
                by_path.setdefault(path, []).append(RowTerms(start, stop, tuple(deltas)))
            start = stop
        return by_path

    def _deliver(self, call, output, report, size: int) -> None:
        request = call.request
        tensors = output if isinstance(output, (tuple, list)) else (output,)
        if not all(bool(torch.isfinite(t).all()) for t in tensors if isinstance(t, torch.Tensor)):
            self.engine.deliver(call, error=NonFiniteOutput(
                f"the denoiser {call.component} returned NaN or infinite values for this request (forward "
                f"{request.batching.forwards + 1} of its run): its inputs or its LoRAs' strengths are out of range"))
            return
        if request.bind_report is None:
            request.bind_report = report
            request.first_forward_s = time.monotonic() - request.started
        request.batching.forwards += 1
        request.batching.largest_batch = max(request.batching.largest_batch, size)
        self.engine.deliver(call, result=output)

