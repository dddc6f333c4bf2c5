"""The one worker thread: takes prompts off the queue and runs them through a persistent PromptExecutor.

Why one thread and one executor: models and the output cache live in the executor and are reused across
prompts (ComfyUI's ``prompt_worker``); running two prompts at once would fight over the same shared model.
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
from typing import Optional

from ..executor.definitions import full_type_name
from .history import HistoryStore, history_entry
from .queue import PromptQueue, QueueItem
from .websocket import ClientRegistry

log = logging.getLogger("lorabind.server")


class PromptWorker:
    def __init__(self, queue: PromptQueue, history: HistoryStore, clients: ClientRegistry, executor):
        self.queue = queue
        self.history = history
        self.clients = clients
        self.executor = executor
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._running_id: Optional[str] = None
        self._running_client: Optional[str] = None
        self._running_node: Optional[str] = None
        self._interrupt: Optional[threading.Event] = None
        self._free_memory = False
        self._unload_models = False

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lorabind-prompt-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the queue, interrupt the running prompt and wait for the thread to finish it."""
        self.queue.close()
        self.interrupt()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- requests from HTTP handlers (event loop thread) ------------------------------------------------
    def interrupt(self, prompt_id: Optional[str] = None) -> bool:
        """Interrupt the running prompt; with ``prompt_id`` only if that one is running (ComfyUI's rule)."""
        with self._lock:
            if self._interrupt is None or (prompt_id is not None and prompt_id != self._running_id):
                return False
            self._interrupt.set()
            return True

    def request_free(self, unload_models: bool, free_memory: bool) -> None:
        """``POST /free``: flags applied by the worker between prompts, never under a running prompt.

        ``free_memory`` drops the executor's cached outputs; ``unload_models`` also drops the loaded models."""
        with self._lock:
            self._unload_models |= bool(unload_models)
            self._free_memory |= bool(free_memory)

    def running_node(self, client_id: str) -> Optional[str]:
        """The node now executing for this client, for the ``executing`` message sent on (re)connect."""
        with self._lock:
            return self._running_node if client_id and client_id == self._running_client else None

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
                self.queue.task_done()
            if item.client_id:
                self.clients.send("executing", {"node": None, "prompt_id": item.prompt_id}, item.client_id)

    def _apply_free_requests(self) -> None:
        with self._lock:
            unload, free = self._unload_models, self._free_memory
            self._unload_models = self._free_memory = False
        if not (unload or free):
            return
        self.executor.reset_cache()  # cached outputs hold model handles: drop them first
        if unload:
            from ...loaders import model_store

            model_store.clear_cache()
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _run(self, item: QueueItem) -> None:
        interrupt_event = threading.Event()
        with self._lock:
            self._running_id, self._running_client = item.prompt_id, item.client_id
            self._running_node, self._interrupt = None, interrupt_event

        def on_event(name: str, data: dict) -> None:
            if name == "executing":
                if data.get("node") is None:
                    return  # sent by _loop once the history entry exists
                with self._lock:
                    self._running_node = data.get("node")
            if item.client_id:
                self.clients.send(name, data, item.client_id)
            elif name == "execution_interrupted":
                self.clients.send(name, data, None)

        extra_data = {**item.extra_data, **item.sensitive}
        try:
            result = self.executor.execute(item.prompt, item.prompt_id, extra_data=extra_data, on_event=on_event,
                                           interrupt_event=interrupt_event,
                                           execute_outputs=item.outputs_to_execute)
            outputs, success, messages, meta = result.outputs, result.success, result.messages, result.meta
        except Exception as exc:  # e.g. a LoRA deleted since validation, or an executor bug: report, keep going
            log.warning("prompt %s could not run: %s", item.prompt_id, exc, exc_info=True)
            error = _execution_failure(item, exc)
            on_event("execution_error", error)
            outputs, success, messages, meta = {}, False, [["execution_error", error]], {}
        finally:
            with self._lock:
                self._running_id = self._running_client = self._running_node = None
                self._interrupt = None
        status_str = "success" if success else "error"
        self.history.add(item.prompt_id, history_entry(item, outputs, status_str, success, messages, meta))


def _execution_failure(item: QueueItem, exc: Exception) -> dict:
    """ComfyUI's execution_error payload for a prompt that failed before any node ran."""
    return {
        "prompt_id": item.prompt_id, "node_id": None, "node_type": None, "executed": [],
        "exception_message": f"{exc}\n", "exception_type": full_type_name(type(exc)),
        "traceback": traceback.format_tb(exc.__traceback__), "current_inputs": {}, "current_outputs": [],
        "timestamp": int(time.time() * 1000),
    }
