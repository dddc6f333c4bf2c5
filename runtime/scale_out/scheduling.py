"""Which waiting prompt a replica runs next: the ones for the binding it holds first, within a fairness bound.

Why: a replica's models carry one set of fused weights. Prompts that reach it interleaved (A, C, A, C…) would
re-fuse on every prompt if run in arrival order; running the waiting A's first and then the C's fuses twice.
No prompt is passed over more than ``MAX_PASSED_OVER`` times, so a prompt for another binding still runs soon.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

MAX_PASSED_OVER = 3


@dataclass(eq=False)
class _Waiter:
    fingerprint: str
    passed_over: int = 0


class BindingFirstTurns:
    """Up to ``capacity`` prompts at a time per replica (its ``--max-batch``: their steps share the replica's step
    engine; 1: one at a time, its models are shared), picked binding-first."""

    def __init__(self, capacity: int = 1):
        self._waiting: list[_Waiter] = []
        self._capacity, self._running = max(1, int(capacity)), 0
        self._bound: str | None = None
        self._changed = asyncio.Condition()

    def _next(self) -> _Waiter:
        oldest = self._waiting[0]
        if oldest.passed_over >= MAX_PASSED_OVER:
            return oldest
        return next((w for w in self._waiting if w.fingerprint == self._bound), oldest)

    async def acquire(self, fingerprint: str) -> None:
        """Wait until it is this prompt's turn (a cancelled wait leaves the line)."""
        waiter = _Waiter(fingerprint)
        async with self._changed:
            self._waiting.append(waiter)
            try:
                await self._changed.wait_for(lambda: self._running < self._capacity and self._next() is waiter)
            except BaseException:
                self._waiting.remove(waiter)
                self._changed.notify_all()
                raise
            for earlier in self._waiting[:self._waiting.index(waiter)]:
                earlier.passed_over += 1
            self._waiting.remove(waiter)
            self._running += 1

    async def release(self, fingerprint: str) -> None:
        """The prompt finished; the replica now holds ``fingerprint``'s binding."""
        async with self._changed:
            self._running, self._bound = self._running - 1, fingerprint
            self._changed.notify_all()
