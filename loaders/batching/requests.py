"""A request inside the step engine, and one forward it waits for.

A request is one sampler run whose denoise loop runs on its own thread (the prompt's) while its forwards run on
the engine's. It carries what the engine needs to batch and bind it (its model, its binding at this step, its
group) and what it needs back (each forward's rows, its bind report, how it was batched), and its own callbacks,
run in its own context: progress and interrupts reach its own prompt, never another's.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..generation.batch_rules import BatchRule
from .bindings import Binding
from .stacking import signature

WAIT_POLL_S = 0.05  # how often a waiting request looks at its interrupt flag
_numbers = itertools.count()


@dataclass
class Batching:
    """How a request was served: forwards run, the largest batch it was in, what ran on its own rows, what had to
    be fused for its whole batch (no per-row form: full diffs, LoKr, DoRA; it shares batches only with requests
    fusing the same), and why it never shared a forward (None when it could)."""

    forwards: int = 0
    largest_batch: int = 0
    row_applied: set = field(default_factory=set)
    fused_for_batch: tuple = ()
    alone: Optional[str] = None

    def to_dict(self, max_batch: int) -> dict:
        return {"max_batch": max_batch, "forwards": self.forwards, "largest_batch": self.largest_batch,
                "row_applied": sorted(self.row_applied), "fused_for_batch": list(self.fused_for_batch),
                "alone": self.alone}


class EngineRequest:
    """One sampler run in the engine; its thread calls ``forward`` (the ``ForwardRoute`` the family's forward
    takes) and blocks until the engine has run it, alone or in a batch."""

    def __init__(self, engine, model, binding: Binding, *, key=None, check_interrupt: Optional[Callable] = None,
                 on_bind: Optional[Callable] = None, interrupt: Optional[threading.Event] = None):
        self.engine, self.model, self.number = engine, model, next(_numbers)
        # known across a job's ranks by its key (``plans``); ``interrupt``: the flag ``check_interrupt`` reads,
        # which a follower's engine sets when rank 0 says the request was interrupted there
        self.key = tuple(key) if key is not None else ("local", self.number)
        self.interrupt, self.forwards_sent = interrupt, 0
        self.context = contextvars.copy_context()  # the prompt's context: its progress, its interrupt flag
        self.check_interrupt, self.on_bind = check_interrupt, on_bind
        self.binding, self.group = binding, None
        self.computing = True  # between two forwards: the engine may wait a moment for its next one
        self.bind_report = None  # the first bind its rows were computed under
        self.batching = Batching()
        self.first_forward_s: Optional[float] = None
        self.started = time.monotonic()

    def rebind(self, binding: Binding) -> None:
        """Its strengths for the next step (a strength schedule): the engine binds them at its next forward."""
        self.engine.regroup(self, binding)

    def forward(self, model, component: str, inputs: dict) -> Any:
        return self.engine.run_forward(self, component, inputs)

    def in_context(self, callback: Optional[Callable], *args):
        """Run one of the request's callbacks from the engine's thread as if on its own (its prompt's context)."""
        if callback is not None:
            return self.context.run(callback, *args)
        return None


class PendingForward:
    """One forward a request waits for: its inputs, what it may stack with, and (once run) its output or error."""

    def __init__(self, request: EngineRequest, component: str, inputs: dict, rule):
        self.request, self.component, self.inputs, self.rule = request, component, inputs, rule
        self.index = request.forwards_sent  # the request's how-many-th forward: what a plan names across ranks
        request.forwards_sent += 1
        self.number = next(_numbers)
        self.signature = signature(rule, inputs) if isinstance(rule, BatchRule) else None
        self.passed_over = 0  # batches run while it waited: past the engine's bound it goes next
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self._done = threading.Event()

    def deliver(self, result=None, error: Optional[BaseException] = None) -> None:
        self.result, self.error = result, error
        self._done.set()

    def wait(self, withdraw: Callable[["PendingForward"], bool]) -> Any:
        """The output, on the request's thread. An interrupt seen while waiting withdraws the forward if the engine
        has not taken it yet (else its output is awaited and dropped), and raises."""
        request = self.request
        while not self._done.wait(WAIT_POLL_S):
            if request.check_interrupt is None:
                continue
            try:
                request.check_interrupt()
            except BaseException:
                if not withdraw(self):
                    self._done.wait()
                raise
        if self.error is not None:
            raise self.error
        return self.result
