"""The prompt queue: a thread-safe priority heap shared by the HTTP handlers and the worker thread.

Ordering is ComfyUI's: an item's priority is its ``number`` (lower runs first; ``front`` negates the counter,
an explicit ``number`` is used as given), ties broken by arrival. Items are the 5-element lists ComfyUI
clients read from ``GET /queue``: ``[number, prompt_id, prompt, extra_data, outputs_to_execute]``.

Below every prompt there is the server's own background work (``while_idle``: the template thumbnails), which
shares the worker's models and folders: it starts only when no prompt is pending, running or being validated,
and while it runs the worker is not handed a prompt, so a user's prompt waits at most for one piece of it (a
thumbnail on the tiny models: about a second). ``background`` says what runs, for the queue's readers.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class QueueItem:
    number: float
    prompt_id: str
    prompt: dict
    extra_data: dict
    outputs_to_execute: list
    sensitive: dict = field(default_factory=dict)  # keys stripped from extra_data (kept for the run, not shown)

    def as_list(self) -> list:
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.outputs_to_execute]

    @property
    def client_id(self) -> Optional[str]:
        return self.extra_data.get("client_id")


class PromptQueue:
    """Pending items in a heap plus the running items; ``on_change`` fires after every mutation.

    One worker runs one item at a time; a scaled-out server (``serve --ray``) has one worker per replica, so
    several items can be running at once.

    ``on_change`` is how the WebSocket layer broadcasts ``status``; it is called outside the lock so a slow
    listener never blocks the worker.
    """

    def __init__(self, on_change: Callable[[], None] | None = None):
        self._heap: list[tuple[float, int, QueueItem]] = []
        self._arrival = itertools.count()
        self._counter = 0
        self._running: list[QueueItem] = []
        self._claimed: set[str] = set()  # ids of prompts being validated, not queued yet
        self._cond = threading.Condition()
        self._closed = False
        self._background: Optional[str] = None  # what ``while_idle`` runs now, if anything
        self.on_change = on_change

    def next_number(self, explicit: float | None = None, front: bool = False) -> float:
        """ComfyUI's numbering: an explicit number is used as is; otherwise the counter (negated for front)."""
        if explicit is not None:
            return float(explicit)
        with self._cond:
            number = self._counter
            self._counter += 1
        return -number if front else number

    def claim(self, prompt_id: str) -> bool:
        """Reserve ``prompt_id`` for a prompt about to be validated; False when it is queued, running or
        claimed already. Checked and reserved under one lock, so two requests can never both get one id."""
        with self._cond:
            in_use = prompt_id in self._claimed or any(
                item.prompt_id == prompt_id for item in (*self._running, *(entry[2] for entry in self._heap)))
            if not in_use:
                self._claimed.add(prompt_id)
            return not in_use

    def release(self, prompt_id: str) -> None:
        """Give back a claimed id whose prompt was refused."""
        with self._cond:
            self._claimed.discard(prompt_id)
            self._cond.notify_all()

    def put(self, item: QueueItem) -> None:
        with self._cond:
            self._claimed.discard(item.prompt_id)
            heapq.heappush(self._heap, (item.number, next(self._arrival), item))
            self._cond.notify_all()  # the worker, or background work waiting for an idle queue
        self._changed()

    def get(self, timeout: float | None = None) -> Optional[QueueItem]:
        """Block until an item is pending (or ``close``/timeout), mark it running and return it."""
        with self._cond:
            if not self._cond.wait_for(lambda: (self._heap and self._background is None) or self._closed,
                                       timeout=timeout):
                return None
            if self._closed:
                return None
            _, _, item = heapq.heappop(self._heap)
            self._running.append(item)
        self._changed()
        return item

    def task_done(self, item: Optional[QueueItem] = None) -> None:
        """``item`` has finished (default: the only running item)."""
        with self._cond:
            if item is None:
                self._running.clear()
            else:
                self._running = [running for running in self._running if running is not item]
            self._cond.notify_all()
        self._changed()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def while_idle(self, label: str, work: Callable[[], object]):
        """Run ``work`` once nothing is pending, running or being validated, holding the next prompt back until
        it returns; ``label`` ("template thumbnail wan21_i2v") is ``background`` meanwhile. Returns what ``work``
        returns, or None without running it when the queue closed first."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or not (self._heap or self._running or self._claimed))
            if self._closed:
                return None
            self._background = label
        self._changed()
        try:
            return work()
        finally:
            with self._cond:
                self._background = None
                self._cond.notify_all()
            self._changed()

    @property
    def background(self) -> Optional[str]:
        """The background work running now (``while_idle``'s label), None when there is none."""
        with self._cond:
            return self._background

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    @property
    def running(self) -> Optional[QueueItem]:
        """The earliest running item, or None."""
        with self._cond:
            return self._running[0] if self._running else None

    def snapshot(self) -> tuple[list[list], list[list]]:
        """(running, pending) as ComfyUI's lists; pending in run order."""
        with self._cond:
            running = [item.as_list() for item in self._running]
            pending = [item.as_list() for _, _, item in sorted(self._heap)]  # arrival is unique: items never compared
        return running, pending

    def has_client(self, client_id: str) -> bool:
        """Is a prompt of this client pending or running? (Its events still have somewhere to go.)"""
        with self._cond:
            return any(item.client_id == client_id for item in (*self._running, *(entry[2] for entry in self._heap)))

    def remaining(self) -> int:
        with self._cond:
            return len(self._heap) + len(self._running)

    def clear(self) -> int:
        with self._cond:
            removed = len(self._heap)
            self._heap.clear()
            self._cond.notify_all()
        if removed:
            self._changed()
        return removed

    def delete(self, prompt_ids) -> int:
        """Remove pending items by id; the running prompt is not touched (``/interrupt`` stops that one)."""
        wanted = {str(p) for p in prompt_ids}
        with self._cond:
            kept = [entry for entry in self._heap if entry[2].prompt_id not in wanted]
            removed = len(self._heap) - len(kept)
            if removed:
                heapq.heapify(kept)
                self._heap = kept
                self._cond.notify_all()
        if removed:
            self._changed()
        return removed

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
