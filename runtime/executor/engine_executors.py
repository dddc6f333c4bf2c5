"""The executors of a host whose prompts share the process's step engine (``serve``, a Ray replica): one
``PromptExecutor`` per worker thread.

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
    """The worker's executor: ``execute`` runs on the calling worker thread's own ``PromptExecutor``."""

    def __init__(self, node_classes: dict, max_batch: int, **engine_options):
        """Makes the process's step engine for ``max_batch`` prompts in flight and installs it (``close``
        removes it): the samplers of every prompt run here find it there. ``engine_options``: a parallel job's
        (its plan stream, whether this rank leads, what to check after each bind)."""
        self.node_classes, self.concurrency = node_classes, int(max_batch)
        self.engine = step_engine.StepEngine(max_batch=max_batch, **engine_options)
        step_engine.install(self.engine)
        self._local = threading.local()
        self._all: list = []
        self._lock = threading.Lock()

    def _mine(self) -> PromptExecutor:
        executor = getattr(self._local, "executor", None)
        if executor is None:
            executor = self._local.executor = PromptExecutor(self.node_classes, node_turn=self.engine.device.held)
            with self._lock:
                self._all.append(executor)
        return executor

    def execute(self, prompt: dict, prompt_id: str, extra_data: dict | None = None, on_event=None,
                interrupt_event=None, execute_outputs: list | None = None, sync=None):
        return self._mine().execute(prompt, prompt_id, extra_data, on_event, interrupt_event, execute_outputs,
                                    sync)

    def reset_cache(self) -> None:
        """``/free``: every thread's cached outputs (the worker calls it only while no prompt runs)."""
        with self._lock:
            executors = list(self._all)
        for executor in executors:
            executor.reset_cache()

    def close(self) -> None:
        """The server stops: the engine's thread ends and the process has no engine any more."""
        self.engine.close()
        if step_engine.installed() is self.engine:
            step_engine.install(None)
