"""One thing at a time on the device: a batch's forward, or another request's node (load, encode, decode).

Why a turn and not a plain lock: a prompt's thread holds the turn while its nodes run, but while its sampler waits
for the step engine it must give the turn up, or the engine could never run the forward it waits for. And the
turn is handed out in arrival order: the engine asks for it before every batch, and with a plain lock it could
take it back at once, forever, from a decode that has been waiting since the last step.
"""

from __future__ import annotations

import contextlib
import threading


class DeviceTurn:
    """A first-come first-served lock that its holder may take again (nodes nest: a sampler inside a node)."""

    def __init__(self):
        self._changed = threading.Condition()
        self._owner = None
        self._depth = 0
        self._next_ticket = 0
        self._serving = 0

    @contextlib.contextmanager
    def held(self):
        self._acquire(1)
        try:
            yield
        finally:
            self._release()

    @contextlib.contextmanager
    def given_up(self):
        """The calling thread's turn, if it holds it, is free for the body and taken back after it."""
        me = threading.get_ident()
        with self._changed:
            depth = self._depth if self._owner == me else 0
            if depth:
                self._owner, self._depth = None, 0
                self._changed.notify_all()
        try:
            yield
        finally:
            if depth:
                self._acquire(depth)

    def _acquire(self, depth: int) -> None:
        me = threading.get_ident()
        with self._changed:
            if self._owner == me:
                self._depth += depth
                return
            ticket = self._next_ticket
            self._next_ticket += 1
            while self._owner is not None or self._serving != ticket:
                self._changed.wait()
            self._serving += 1
            self._owner, self._depth = me, depth
            self._changed.notify_all()  # the next ticket may now wait for the owner instead of its number

    def _release(self) -> None:
        with self._changed:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._changed.notify_all()
