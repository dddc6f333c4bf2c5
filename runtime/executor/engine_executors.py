"""The executors of a host whose prompts share the process's step engine (``serve``, a Ray replica): one
``PromptExecutor`` per worker thread (a slot).

Why one per thread: an executor runs one prompt at a time (its output cache and node instances are that prompt's
working state), and ``serve --max-batch N`` keeps N prompts in flight, each on its own worker thread, each
running its nodes in order. Their samplers meet in the step engine, which batches their denoising steps; every
node runs inside the engine's device turn, so loads, encodes and decodes take their turn between two batched
steps. The loaded models are shared through the model store, as they are between ComfyUI's prompts.
"""

from __future__ import annotations

import threading

from ...loaders.batching import engine as step_engine
from .execution import PromptExecutor


class EngineExecutors:
    """The worker's executor: ``execute`` runs on one of ``max_batch`` ``PromptExecutor`` slots: the calling
    worker thread's own, or the slot a parallel job's rank 0 named (so that a prompt finds the same cached outputs
    on every rank: rank 1 runs each prompt on the slot rank 0 ran it on)."""

    def __init__(self, node_classes: dict, max_batch: int, **engine_options):
        """Makes the process's step engine for ``max_batch`` prompts in flight and installs it (``close``
        removes it): the samplers of every prompt run here find it there. ``engine_options``: a parallel job's
        (its plan stream, whether this rank leads, what to check after each bind)."""
        self.node_classes, self.concurrency = node_classes, int(max_batch)
        self.engine = step_engine.StepEngine(max_batch=max_batch, **engine_options)
        step_engine.install(self.engine)
        self._local = threading.local()
        self._slots: dict = {}
        self._lock = threading.Lock()

    def slot(self) -> int:
        """The calling thread's slot: one per worker thread, in the order they first ran a prompt (always 0 with
        one prompt at a time, whichever thread runs it)."""
        slot = getattr(self._local, "slot", None)
        if slot is None:
            with self._lock:
                slot = self._local.slot = 0 if self.concurrency == 1 else len(self._slots)
                self._slots.setdefault(slot, None)
        return slot

    def _executor(self, slot: int) -> PromptExecutor:
        with self._lock:
            executor = self._slots.get(slot)
            if executor is None:
                executor = self._slots[slot] = PromptExecutor(self.node_classes, node_turn=self.engine.device.held)
            return executor

    def execute(self, prompt: dict, prompt_id: str, extra_data: dict | None = None, on_event=None,
                interrupt_event=None, execute_outputs: list | None = None, sync=None, slot: int | None = None):
        executor = self._executor(self.slot() if slot is None else slot)
        return executor.execute(prompt, prompt_id, extra_data, on_event, interrupt_event, execute_outputs, sync)

    def cached_uis(self) -> list[dict]:
        """Every slot's cached UI dicts."""
        with self._lock:
            executors = [e for e in self._slots.values() if e is not None]
        return [ui for executor in executors for ui in executor.cached_uis()]

    def reset_cache(self) -> None:
        """``/free``: every slot's cached outputs (the worker calls it only while no prompt runs)."""
        with self._lock:
            executors = [e for e in self._slots.values() if e is not None]
        for executor in executors:
            executor.reset_cache()

    def close(self) -> None:
        """The server stops: the engine's thread ends and the process has no engine any more."""
        self.engine.close()
        if step_engine.installed() is self.engine:
            step_engine.install(None)
