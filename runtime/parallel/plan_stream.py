"""The step engines' plan stream over the job's store: rank 0's engine publishes each plan (``loaders.batching.
plans``) as ``plan<n>``; every other rank's engine reads ``plan0``, ``plan1``, ... in order.

Why the job's store and not the group's collectives: the plans decide which collectives run next, so they cannot
travel on them; the store (``JobStore``: loopback, every value signed with the job's secret) is a connection of
its own, polled in a millisecond. Each follower says how far it has read (``planread/r<rank>``) every
``ACK_EVERY`` plans, and rank 0 deletes what every rank has read, so a long-running server's store stays small.
"""

from __future__ import annotations

import time

from .job_store import JobStore

POLL_S = 0.001  # a plan follows a forward of milliseconds to seconds; a store round trip is ~0.1 ms
ACK_EVERY = 64


class StorePlans:
    """``PlanStream`` of one rank; ``store``: a connection of the engine's own (``JobStore.connection``)."""

    def __init__(self, store: JobStore, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self._next = 0
        self._deleted = 0

    def publish(self, plan: dict) -> None:
        self.store.set(f"plan{self._next}", plan)
        self._next += 1
        if self._next % ACK_EVERY == 0:
            self._forget_read()

    def receive(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        try:
            while (plan := self.store.peek(f"plan{self._next}")) is None:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(POLL_S)
        except RuntimeError:  # the store's host (rank 0) stopped
            return None
        self._next += 1
        if self._next % ACK_EVERY == 0:
            self.store.set(f"planread/r{self.rank}", self._next)
        return plan

    def _forget_read(self) -> None:
        """Rank 0: delete the plans every other rank has read."""
        read = [self.store.peek(f"planread/r{rank}") for rank in range(1, self.world_size)]
        if any(value is None for value in read):
            return
        upto = min(int(value) for value in read)
        if upto > self._deleted:
            self.store.delete([f"plan{n}" for n in range(self._deleted, upto)])
            self._deleted = upto
