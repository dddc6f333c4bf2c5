"""The worker threads: take prompts off the queue and run them through a persistent executor.

Why one thread and one executor by default: models and the output cache live in the executor and are reused
across prompts (ComfyUI's ``prompt_worker``); running two prompts at once would fight over the same shared
model. A scaled-out server (``serve --ray``) runs a few threads per replica: its executor forwards each prompt
to a replica, which owns its own models and runs one prompt at a time, so prompts in flight never share weights.
Events go only to the submitting client (``extra_data["client_id"]``), except ``execution_interrupted`` which
ComfyUI broadcasts when the prompt has no client. The executor's own final ``executing {node: None}`` is held
back and sent only after the history entry is written, because clients treat it as "done, fetch history now".
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

from ...loaders.models import store as model_store
from ..executor.definitions import full_type_name
from ..preview_options import EXTRA_DATA_KEY, NO_PREVIEWS, PreviewOptions
from . import prompt_log
from .history import HistoryStore, history_entry
from .queue import PromptQueue, QueueItem
from .websocket import ClientRegistry

log = logging.getLogger("lorabind.server")


@dataclass
class _Run:
    """A prompt in flight on one worker thread: who queued it, which node runs, how to interrupt it."""

    prompt_id: str
    client_id: Optional[str]
    interrupt: threading.Event = field(default_factory=threading.Event)
    node: Optional[str] = None


class PromptWorker:
    def __init__(self, queue: PromptQueue, history: HistoryStore, clients: ClientRegistry, executor,
                 concurrency: int = 1, unload_models=None, previews: Optional[PreviewOptions] = None):
        self.queue = queue
        self.previews = previews or NO_PREVIEWS  # the server's preview settings (a prompt may name its own method)
        self.history = history
        self.clients = clients
        self.executor = executor
        # what ``/free`` with unload_models does after dropping the cached outputs: this process's model store, or
        # (``serve --parallel``) every rank's
        self.unload_models = unload_models or model_store.clear_cache
        self.concurrency = max(1, int(concurrency))
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._runs: dict[int, _Run] = {}  # worker thread ident -> its prompt in flight
        self._free_memory = False
        self._unload_models = False

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        for index in range(self.concurrency):
            thread = threading.Thread(target=self._loop, name=f"lorabind-prompt-worker-{index}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the queue, interrupt the running prompts and wait for the threads to finish them."""
        self.queue.close()
        self.interrupt()
        for thread in self._threads:
            thread.join(timeout)

    # -- requests from HTTP handlers (event loop thread) ------------------------------------------------
    def interrupt(self, prompt_id: Optional[str] = None) -> bool:
        """Interrupt the running prompts; with ``prompt_id`` only that one if it runs (ComfyUI's rule)."""
        with self._lock:
            runs = [run for run in self._runs.values() if prompt_id is None or run.prompt_id == prompt_id]
            for run in runs:
                run.interrupt.set()
            return bool(runs)

    def request_free(self, unload_models: bool, free_memory: bool) -> None:
        """``POST /free``: flags applied by the worker between prompts, never under a running prompt.

        ``free_memory`` drops the executor's cached outputs; ``unload_models`` also drops the loaded models."""
        with self._lock:
            self._unload_models |= bool(unload_models)
            self._free_memory |= bool(free_memory)

    def running(self) -> tuple[Optional[str], Optional[str]]:
        """(prompt id, node id) of a running prompt (the first, when replicas run several), (None, None) when idle."""
        with self._lock:
            run = next(iter(self._runs.values()), None)
        return (run.prompt_id, run.node) if run is not None else (None, None)

    def running_node(self, client_id: str) -> Optional[str]:
        """The node now executing for this client, for the ``executing`` message sent on (re)connect."""
        with self._lock:
            nodes = [run.node for run in self._runs.values() if client_id and run.client_id == client_id]
        return next((node for node in nodes if node is not None), None)

    # -- the thread -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            item = self.queue.get(timeout=1.0)
            self._apply_free_requests()
            if item is None:
                if self.queue.closed:
                    return
                continue
            try:
                self._run(item)
            except Exception:  # e.g. the history folder became unwritable: log it, keep serving the queue
                log.exception("prompt %s: could not record its result", item.prompt_id)
            finally:
                self.queue.task_done(item)
            if item.client_id:
                self.clients.send("executing", {"node": None, "prompt_id": item.prompt_id}, item.client_id)

    def _apply_free_requests(self) -> None:
        with self._lock:
            if self._runs or self.queue.background:  # a prompt or the thumbnails use the models: free after
                return
            unload, free = self._unload_models, self._free_memory
            self._unload_models = self._free_memory = False
        if not (unload or free):
            return
        self.executor.reset_cache()  # cached outputs hold model handles: drop them first
        if unload:
            self.unload_models()
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _run(self, item: QueueItem) -> None:
        run = _Run(item.prompt_id, item.client_id)
        with self._lock:
            self._runs[threading.get_ident()] = run

        def on_event(name: str, data: dict) -> None:
            if name == "executing":
                if data.get("node") is None:
                    return  # sent by _loop once the history entry exists
                with self._lock:
                    run.node = data.get("node")
            if item.client_id:
                self.clients.send(name, data, item.client_id)
            elif name == "execution_interrupted":
                self.clients.send(name, data, None)

        # the preview settings go to this run only (not the history): a prompt without a client gets none
        previews = self.previews.for_prompt(item.extra_data) if item.client_id else NO_PREVIEWS.for_prompt({})
        extra_data = {**item.extra_data, **item.sensitive, EXTRA_DATA_KEY: previews}
        prompt_log.started(item.prompt_id)
        started = time.monotonic()
        try:
            result = self.executor.execute(item.prompt, item.prompt_id, extra_data=extra_data, on_event=on_event,
                                           interrupt_event=run.interrupt,
                                           execute_outputs=item.outputs_to_execute)
            outputs, success, messages, meta = result.outputs, result.success, result.messages, result.meta
        except Exception as exc:  # e.g. a LoRA deleted since validation, or an executor bug: report, keep going
            log.warning("prompt %s could not run: %s", item.prompt_id, exc, exc_info=True)
            error = _execution_failure(item, exc)
            on_event("execution_error", error)
            outputs, success, messages, meta = {}, False, [["execution_error", error]], {}
        finally:
            with self._lock:
                del self._runs[threading.get_ident()]
        status_str = "success" if success else "error"
        self.history.add(item.prompt_id, history_entry(item, outputs, status_str, success, messages, meta))
        prompt_log.ended(item.prompt_id, success, messages, outputs, time.monotonic() - started)


def _execution_failure(item: QueueItem, exc: Exception) -> dict:
    """ComfyUI's execution_error payload for a prompt that failed before any node ran."""
    return {
        "prompt_id": item.prompt_id, "node_id": None, "node_type": None, "executed": [],
        "exception_message": f"{exc}\n", "exception_type": full_type_name(type(exc)),
        "traceback": traceback.format_tb(exc.__traceback__), "current_inputs": {}, "current_outputs": [],
        "timestamp": int(time.time() * 1000),
    }
