"""A deadline a caller puts on the work of the current thread; the long loops of a read check it and stop.

Why: a thread cannot be stopped from outside. The editor's contract lookups run in worker threads with a
timeout; when the answer gives up (503), the work must stop too, not run on allocating in the background (issue
46). The reads that can take long however bounded their input is (hashing a large file for a contract table's
``sha256:`` entries, walking a long table) call ``check_deadline`` between steps; everything else a lookup does
is bounded by the read budgets. Threads that set no deadline are never interrupted.
"""

from __future__ import annotations

import contextlib
import threading
import time

from ..errors import LoraBindError

_state = threading.local()


class DeadlinePassed(LoraBindError):
    """The work ran past the deadline its caller set, and stopped."""


@contextlib.contextmanager
def read_deadline(seconds: float, what: str):
    """Within this block, ``check_deadline`` raises ``DeadlinePassed`` (naming ``what``) ``seconds`` from now."""
    previous = getattr(_state, "deadline", None)
    _state.deadline = (time.monotonic() + seconds, seconds, what)
    try:
        yield
    finally:
        _state.deadline = previous


def check_deadline() -> None:
    """Raise ``DeadlinePassed`` if this thread's work is past the deadline its caller set."""
    deadline = getattr(_state, "deadline", None)
    if deadline is not None and time.monotonic() > deadline[0]:
        raise DeadlinePassed(f"{deadline[2]} took longer than {deadline[1]:g} s and was stopped")
