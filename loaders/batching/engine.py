"""The step engine: several requests' denoising steps run together, one batched forward at a time.

How it works: each request's sampler runs its own denoise loop on its own thread (noise, sigmas, guidance and
scheduler state stay the request's own, exactly as alone), and each denoiser forward it needs becomes a
``PendingForward`` here. The engine's thread gathers the forwards waiting at a step boundary, picks a batch
(``grouping``), binds the model to the batch's base (the incremental, transactional ``bind``), stacks the inputs
(``stacking``), runs one forward with each request's own LoRAs on its own rows (``row_lora``) and hands every
request its rows back. A request that arrives while others run joins at their next forward; one that is done
leaves; nobody waits for the slowest.

Everything else on the device (a model load, a text encode, a decode) takes the ``DeviceTurn`` too, so it runs
between two forwards, one at a time. With ``max_batch`` 1 every forward runs alone under its request's whole
binding: the same computation as a run without the engine.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections import OrderedDict
from typing import Optional

from ..families import family_for
from ..generation.forward_route import enter_route, leave_route
from .bindings import Binding, RowForms
from .device_turn import DeviceTurn
from .execution import BatchRunner
from .following import FOLLOW_TIMEOUT_S, Follower
from .grouping import Groups, choose_batch
from .plans import LEFT_INTERRUPTED, Chosen, PlanStream, batch_plan, left_plan
from .requests import EngineRequest, PendingForward
from .row_lora import RowLoraError

PASS_OVER_LIMIT = 8  # batches a waiting forward can be passed over before it goes next (see ``grouping``)
GATHER_WINDOW_S = 0.05  # at most this long for requests between two forwards to submit their next one
OCCURRENCES_KEPT = 4096


class StepEngine:
    """One per process (``install``): every routed denoiser forward of every model goes through its thread."""

    def __init__(self, max_batch: int = 1, pass_over_limit: int = PASS_OVER_LIMIT,
                 gather_window_s: float = GATHER_WINDOW_S, plans: Optional[PlanStream] = None, leads: bool = True,
                 follow_timeout_s: float = FOLLOW_TIMEOUT_S, after_bind=None):
        """``plans``: a parallel job's plan stream (``plans``): rank 0's engine ``leads`` (decides and publishes
        each forward), every other rank's follows it. ``after_bind(model, base)``: called after each batch's bind,
        on the engine's thread (a parallel job compares the ranks' bound weights there, a collective that every
        rank's engine reaches at the same plan)."""
        if int(max_batch) < 1:
            raise ValueError(f"max_batch is 1 or more, got {max_batch}")
        self.max_batch, self.pass_over_limit = int(max_batch), int(pass_over_limit)
        self.gather_window_s = float(gather_window_s)
        self.plans = plans if leads else None
        self.follower = None if leads or plans is None else Follower(self, plans, follow_timeout_s)
        self.after_bind = after_bind
        self.device = DeviceTurn()
        self._changed = threading.Condition()
        self._requests: list = []
        self._pending: list = []
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._occurrences: OrderedDict = OrderedDict()  # request key -> how many requests of it came so far
        self.groups = Groups(RowForms(), self.max_batch)
        self.runner = BatchRunner(self)

    # -- the request's side ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def denoising(self, model, binding: Binding, *, key=None, check_interrupt=None, on_bind=None, interrupt=None):
        """The body's denoiser forwards (this thread's) go through the engine; the thread's device turn is given up
        meanwhile. Yields the ``EngineRequest``. ``key``: the request's name across a job's ranks; ``interrupt``:
        the flag ``check_interrupt`` reads (a follower sets it when rank 0 says the request was interrupted)."""
        request = EngineRequest(self, model, binding, key=self._numbered(key), check_interrupt=check_interrupt,
                                on_bind=on_bind, interrupt=interrupt)
        request.group = self.groups.key_of(request)
        if self.max_batch > 1:  # said in its report: these make it share batches only with the same binding
            fixed = self.groups.row_forms.fixed_keys(model, binding)
            request.batching.fused_for_batch = tuple(spec.name or spec.path for key, spec in binding.keys.items()
                                                     if key in fixed)
        with self._changed:
            if self._closed:
                raise RuntimeError("the step engine has been closed")
            self._requests.append(request)
            self._start()
        token = enter_route(request)
        try:
            with self.device.given_up():
                yield request
        except BaseException as error:
            if self.plans is not None:  # rank 0: every rank stops this request at the same forward
                interrupted = request.interrupt is not None and request.interrupt.is_set()
                self.plans.publish(left_plan(request.key, LEFT_INTERRUPTED if interrupted else str(error)))
            raise
        finally:
            leave_route(token)
            self._leave(request)

    def _numbered(self, key) -> Optional[tuple]:
        """``key`` with how many requests of that key came before (a sampler node run on a list of inputs runs
        once per item, in the same order on every rank)."""
        if key is None:
            return None
        with self._changed:
            seen = self._occurrences.pop(tuple(key), -1) + 1
            self._occurrences[tuple(key)] = seen
            while len(self._occurrences) > OCCURRENCES_KEPT:
                self._occurrences.popitem(last=False)
        return (*key, seen)

    def regroup(self, request: EngineRequest, binding: Binding) -> None:
        with self._changed:
            request.binding = binding
            request.group = self.groups.key_of(request)

    def row_form_failed(self, model, reason: str) -> None:
        """A layer of ``model`` hid the batch from a per-row LoRA: its requests' LoRAs are fused from now on (each
        is regrouped by its whole binding)."""
        with self._changed:
            self.groups.row_forms.refuse(model, reason)
            for request in self._requests:
                if request.model is model:
                    request.group = self.groups.key_of(request)

    def run_forward(self, request: EngineRequest, component: str, inputs: dict):
        rule = family_for(request.model).sampling.batch_rule(request.model, component)
        call = PendingForward(request, component, inputs, rule)
        if call.signature is None and request.batching.alone is None:
            request.batching.alone = getattr(rule, "reason", "its forward's inputs do not stack")
        with self._changed:
            request.computing = False
            self._pending.append(call)
            self._changed.notify_all()
        if self.follower is not None:
            self.follower.arrived(call)
        return call.wait(self.withdraw)

    def withdraw(self, call: PendingForward) -> bool:
        """Take ``call`` out of the queue if the engine has not taken it yet (an interrupt, a stopped request)."""
        with self._changed:
            if call in self._pending:
                self._pending.remove(call)
                return True
            return False

    def _leave(self, request: EngineRequest) -> None:
        with self._changed:
            self._requests.remove(request)
            self._pending = [call for call in self._pending if call.request is not request]
            self.groups.forget_unused({r.group for r in self._requests})
            others = any(r.model is request.model for r in self._requests)
            self._changed.notify_all()
        placement = getattr(request.model, "placement", None)
        if placement is not None and not others:  # the last request of this model: its denoise is over
            with self.device.held():
                placement.end_denoise()

    # -- the engine's thread --------------------------------------------------------------------------------
    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(5.0)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="lorabind-step-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while (chosen := self._next()) is not None:
            try:
                self.runner.run(chosen)
            except BaseException as error:  # noqa: B902 (delivered to the requests, never raised on this thread)
                self._failed(chosen, error)

    def _next(self) -> Optional[Chosen]:
        if self.follower is not None:
            return self.follower.next()
        chosen = self._next_batch()
        if chosen is not None and self.plans is not None:
            self.plans.publish(batch_plan(chosen))
        return chosen

    def _failed(self, chosen: Chosen, error: BaseException) -> None:
        """A batch that raised: rank 0 (or a lone engine) runs its requests again one by one, each under its whole
        binding, so whoever broke it fails alone; a follower puts them back and waits for rank 0's plans."""
        if isinstance(error, RowLoraError):  # this model's layers cannot take rows: fuse from now on
            self.row_form_failed(chosen.calls[0].request.model, str(error))
        if self.follower is not None:
            with self._changed:
                self._pending[:0] = chosen.calls
            return
        if chosen.whole and len(chosen.calls) == 1:
            self.deliver(chosen.calls[0], error=error)
            return
        for call in chosen.calls:
            alone = Chosen([call], frozenset(call.request.binding.keys), whole=True)
            if self.plans is not None:
                self.plans.publish(batch_plan(alone))
            try:
                self.runner.run(alone)
            except BaseException as own_error:  # noqa: B902
                self.deliver(call, error=own_error)

    def deliver(self, call: PendingForward, result=None, error: Optional[BaseException] = None) -> None:
        """Hand ``call`` its output (or error): its request is between two forwards from now until it sends its
        next one (marked before it wakes, so the next gather waits for it and never for one already waiting)."""
        with self._changed:
            call.request.computing = True
        call.deliver(result, error)

    def _next_batch(self) -> Optional[Chosen]:
        """Wait for forwards, and a moment more for the requests that are between two forwards; take a batch."""
        with self._changed:
            while not self._pending:
                if self._closed:
                    return None
                self._changed.wait()
            deadline = time.monotonic() + self.gather_window_s
            while any(r.computing for r in self._requests) and time.monotonic() < deadline:
                self._changed.wait(max(0.0, deadline - time.monotonic()))
            batch = choose_batch(self._pending, self.max_batch, self.pass_over_limit, self.runner.last_component,
                                 self.runner.needs_rebind)
            for call in batch:
                self._pending.remove(call)
            for call in self._pending:
                call.passed_over += 1
            whole = batch[0].signature is None  # a forward that stacks with nothing: its whole binding
            base = frozenset(batch[0].request.binding.keys) if whole else self.groups.base_of(
                batch[0].request.group, [r for r in self._requests if r.group == batch[0].request.group])
            return Chosen(batch, base, whole)

    def lead_with(self, plans: PlanStream) -> None:
        """Rank 0 after its job started its ranks again: publish to the new generation's stream (no request is in
        flight then: a lost rank failed them all)."""
        with self._changed:
            self.plans = plans

    def resize(self, max_batch: int) -> None:
        """Batch up to ``max_batch`` from the next request on (the ones in flight keep their groups)."""
        if int(max_batch) < 1:
            raise ValueError(f"max_batch is 1 or more, got {max_batch}")
        with self._changed:
            self.max_batch = self.groups.max_batch = int(max_batch)

    def in_flight(self) -> int:
        """Requests denoising now."""
        with self._changed:
            return len(self._requests)

    def members(self, group) -> list:
        """The requests in flight in ``group`` (for its base)."""
        with self._changed:
            return [r for r in self._requests if r.group == group]

    # -- what a follower reaches into -------------------------------------------------------------------------
    def take_pending(self, wanted: list, timeout_s: float) -> Optional[list]:
        """The waiting forwards named by ``wanted`` ([request key, forward index] pairs), in that order, once all
        are waiting (taken out of the queue); None when they were not all there within ``timeout_s``."""
        wanted = [(tuple(key), int(index)) for key, index in wanted]
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                found = {(tuple(c.request.key), c.index): c for c in self._pending}
                if all(name in found for name in wanted):
                    calls = [found[name] for name in wanted]
                    for call in calls:
                        self._pending.remove(call)
                    return calls
                if self._closed or time.monotonic() >= deadline:
                    return None
                self._changed.wait(max(0.0, deadline - time.monotonic()))

    def is_closed(self) -> bool:
        return self._closed

    def requests_in_flight(self) -> list:
        with self._changed:
            return list(self._requests)

    def pending_of(self, key) -> list:
        with self._changed:
            return [call for call in self._pending if tuple(call.request.key) == tuple(key)]


_installed: Optional[StepEngine] = None
_in_context: contextvars.ContextVar[Optional[StepEngine]] = contextvars.ContextVar("lorabind_step_engine",
                                                                                  default=None)


def install(engine: Optional[StepEngine]) -> None:
    """Make ``engine`` the process's (``serve`` does: every prompt's sampler uses it); None removes it."""
    global _installed
    _installed = engine


def installed() -> Optional[StepEngine]:
    """The engine this thread's samplers use: one a caller entered (``used``), else the process's, else None."""
    return _in_context.get() or _installed


@contextlib.contextmanager
def used(engine: StepEngine):
    """For the body, this thread's samplers use ``engine`` (the Python API's calls: nothing else in the process,
    e.g. ComfyUI's own prompts, is routed through it)."""
    token = _in_context.set(engine)
    try:
        yield engine
    finally:
        _in_context.reset(token)
