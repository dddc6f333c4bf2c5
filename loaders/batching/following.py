"""A follower rank's engine: it runs the forwards rank 0's engine decided, in rank 0's order (``plans``).

For each plan it waits until its own requests (the same prompts, run on this rank's threads) have reached the
forwards the plan names, then runs them as one batch under the plan's base. A request rank 0 says was interrupted
is interrupted here too (its own interrupt flag is set, so it stops exactly as an interrupted prompt does); one
that failed there fails here with rank 0's reason. What never comes within the timeout (rank 0 stalled or gone, or
this rank's prompt no longer where rank 0's is) fails the requests that wait, naming rank 0.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from ..errors import LoraBindError
from .plans import LEFT_INTERRUPTED, Chosen, base_keys

FOLLOW_TIMEOUT_S = 600.0  # a follower waits this long for rank 0's next plan while requests wait, as collectives do
IDLE_POLL_S = 1.0
GONE_KEPT = 1024  # requests rank 0 has let go of, remembered for a follower that is behind


class StoppedOnRankZero(LoraBindError):
    """Rank 0 stopped this request (its error is the text), or never said what to run next."""


class Follower:
    def __init__(self, engine, plans, timeout_s: float = FOLLOW_TIMEOUT_S):
        self.engine, self.plans, self.timeout_s = engine, plans, float(timeout_s)
        self._gone: OrderedDict = OrderedDict()  # request key -> why it left rank 0

    def next(self) -> Optional[Chosen]:
        """The next batch rank 0 decided, with this rank's own forwards; None once the engine is closed."""
        waited = 0.0
        while True:
            plan = self.plans.receive(IDLE_POLL_S)
            if plan is None:
                if self.engine.is_closed():
                    return None
                waited = waited + IDLE_POLL_S if self.engine.requests_in_flight() else 0.0
                if waited >= self.timeout_s:
                    self._fail_waiting(f"rank 0 decided no forward for {self.timeout_s:g} s")
                    waited = 0.0
                continue
            waited = 0.0
            if "left" in plan:
                self._left(tuple(plan["left"]), plan["why"])
                continue
            calls = self.engine.take_pending(plan["batch"], self.timeout_s)
            if calls is None:
                self._fail_waiting("this rank's requests did not reach the forwards rank 0 ran "
                                   f"within {self.timeout_s:g} s")
                continue
            return Chosen(calls, base_keys(calls[0].request.binding, plan["base"]), bool(plan["whole"]))

    def arrived(self, call) -> None:
        """A forward a request of this rank sends: one rank 0 has already let go of stops at once."""
        why = self._gone.get(tuple(call.request.key))
        if why is not None:
            self._stop(call.request, why)

    def _left(self, key: tuple, why: str) -> None:
        self._gone[key] = why
        while len(self._gone) > GONE_KEPT:
            self._gone.popitem(last=False)
        for request in self.engine.requests_in_flight():
            if tuple(request.key) == key:
                self._stop(request, why)

    def _stop(self, request, why: str) -> None:
        """Stop ``request`` as rank 0 stopped it: its interrupt flag for an interrupt, else rank 0's error."""
        if why == LEFT_INTERRUPTED and request.interrupt is not None:
            request.interrupt.set()  # its wait sees the flag and leaves as an interrupted prompt does
            return
        error = StoppedOnRankZero(f"rank 0 stopped this request: {why}")
        for call in self.engine.pending_of(request.key):
            if self.engine.withdraw(call):
                self.engine.deliver(call, error=error)

    def _fail_waiting(self, why: str) -> None:
        for request in self.engine.requests_in_flight():
            for call in self.engine.pending_of(request.key):
                if self.engine.withdraw(call):
                    self.engine.deliver(call, error=StoppedOnRankZero(why))
