"""PromptExecutor: runs API-format prompts with ComfyUI's semantics and emits ComfyUI's WebSocket events.

One executor persists across prompts (the server and ``lorabind run`` keep it), so its signature cache makes a
re-run that only changes a seed execute only the nodes downstream of the seed, and node instances persist per
(node_id, class_type). Events are ``on_event(name, data)`` with ComfyUI's names and payloads; the ones ComfyUI
keeps in a history entry's ``status.messages`` are also returned in ``ExecutionResult.messages``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from ..context import ExecutionContext, InterruptedByUser, reset_current_context, set_current_context
from ..preview_options import PREVIEW_EVENT, PreviewOptions
from .caching import CacheEntry, InstanceCache, OutputCache, node_signatures
from .call_over_lists import format_value, gather_inputs, map_over_lists, shape_returns
from .definitions import NodeDefinitions, full_type_name
from .graph import DependencyCycleError, ExecutionList
from .validation import ValidationResult
from .validation_memo import ValidationMemo

EventCallback = Callable[[str, dict], None]


class RunSync:
    """Where a prompt's run meets the other ranks of a parallel job (``runtime.parallel.prompt_channel.Lockstep``):
    before each node starts, and when a node fails. Within a sampler the ranks meet in the step engine's plans
    (``loaders.batching.plans``) instead. Nothing to meet in one process: these do nothing."""

    def before_node(self, node_id: str) -> None:
        """Called after the node's ``executing`` event, before its inputs are gathered (may raise to stop)."""

    def node_failed(self, node_id: str, node_type: str, message: str) -> None:
        """Called after a node's ``execution_error`` event."""


@dataclass
class ExecutionResult:
    """Outcome of one prompt. ``outputs`` = {node_id: ui dict} (history "outputs"); ``executed`` = node ids
    that ran, in order; ``cached`` = node ids whose outputs were cache hits; ``error`` = the execution_error
    payload; ``messages`` = [[event, data]] for ComfyUI's history status; ``meta`` = history "meta"."""

    success: bool
    outputs: dict = field(default_factory=dict)
    executed: list = field(default_factory=list)
    cached: list = field(default_factory=list)
    error: dict | None = None
    interrupted: bool = False
    messages: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)


class PromptValidationError(ValueError):
    """``execute`` was given a prompt that does not validate; ``.result`` holds the ValidationResult."""

    def __init__(self, result: ValidationResult):
        error = result.error or {}
        super().__init__(f"{error.get('message', 'Prompt failed validation')}: {error.get('details', '')}")
        self.result = result


class PromptExecutor:
    """``node_turn``: a context manager every node runs inside (a served process's ``DeviceTurn``: one node or
    batched step at a time on the device, while several prompts are in flight); None runs nodes as they come."""

    def __init__(self, node_classes: dict, *, cache: bool = True, node_turn: Callable | None = None):
        self.node_classes = node_classes
        self.node_turn = node_turn or contextlib.nullcontext
        self.output_cache = OutputCache(enabled=cache)
        self.instances = InstanceCache()
        self._run_lock = threading.Lock()
        self._validations = ValidationMemo()  # a seed-only rerun re-checks only the nodes that changed
        # The interrupt flag of prompts whose caller passes none: nobody else holds it and every prompt clears it, so
        # one per executor behaves as a fresh one and saves building an Event (a Condition, a Lock) per prompt.
        self._unshared_interrupt = threading.Event()

    def validate(self, prompt: dict, partial_execution_targets=None) -> ValidationResult:
        return self._validations.validate(self.node_classes, prompt, partial_execution_targets)

    def cached_uis(self) -> list[dict]:
        """The UI dicts the cached outputs would replay (a Ray replica keeps the files they name)."""
        return self.output_cache.uis()

    def reset_cache(self) -> None:
        """Drop cached outputs and node instances (the server's /free)."""
        with self._run_lock:
            self.output_cache.clear()
            self.instances.clear()

    def execute(self, prompt: dict, prompt_id: str, extra_data: dict | None = None,
                on_event: EventCallback | None = None, interrupt_event: threading.Event | None = None,
                execute_outputs: list | None = None, sync: RunSync | None = None) -> ExecutionResult:
        """Validate (casting constants), then run the valid outputs in ``execute_outputs`` (default: all).

        Raises PromptValidationError if no requested output validates; node failures and interrupts are
        reported in the result (and as events), never raised.
        """
        interrupt_event = interrupt_event if interrupt_event is not None else self._unshared_interrupt
        # ComfyUI resets the interrupt flag when a prompt starts. Done before validating, not after: an
        # interrupt sent while this prompt validates (INPUT_TYPES may scan model folders) must still stop it.
        interrupt_event.clear()
        # One INPUT_TYPES() per class for validating and running (it may scan model folders).
        definitions = NodeDefinitions(self.node_classes)
        validation = self._validations.validate(self.node_classes, prompt, execute_outputs, definitions)
        if not validation.ok:
            raise PromptValidationError(validation)
        with self._run_lock:
            run = _PromptRun(self, definitions, validation.prompt, prompt_id, extra_data or {}, on_event,
                             interrupt_event, sync or RunSync())
            return run.run(validation.outputs)


def _timestamp() -> int:
    return int(time.time() * 1000)


def node_meta(node_id: str) -> dict:
    """ComfyUI's history ``meta`` entry of a node that is not part of an expansion (we have none)."""
    return {"node_id": node_id, "display_node": node_id, "parent_node": None, "real_node_id": node_id}


class _PromptRun:
    """The state of executing one prompt: available outputs, scheduling, events, result."""

    def __init__(self, executor: PromptExecutor, definitions: NodeDefinitions, prompt: dict, prompt_id: str,
                 extra_data: dict, on_event: EventCallback | None, interrupt_event: threading.Event,
                 sync: RunSync):
        self.executor = executor
        self.prompt = prompt
        self.prompt_id = prompt_id
        self.extra_data = extra_data
        self.on_event = on_event
        self.sync = sync
        self.interrupt_event = interrupt_event
        self.definitions = definitions
        self.available: dict[str, CacheEntry] = {}  # outputs usable in this run: cache hits + nodes run
        self.keys: dict[str, Any] = {}  # node id -> cache key (None: never cached)
        self.result = ExecutionResult(success=False)
        self.previews = PreviewOptions.of_prompt(extra_data)  # what the host asked for this prompt's samplers

    # -- events -------------------------------------------------------------------------------------------
    def emit(self, name: str, data: dict, *, status_message: bool = False) -> None:
        if status_message:
            data = {**data, "timestamp": _timestamp()}
            self.result.messages.append([name, data])
        if self.on_event is not None:
            self.on_event(name, data)

    def _on_progress(self, node_id: str, value: int, total: int, extra: dict | None) -> None:
        """Progress of the running node; like ComfyUI's progress hook it is also an interrupt point."""
        self.emit("progress", {"value": value, "max": total, "prompt_id": self.prompt_id, "node": node_id})
        self.check_interrupted()

    def _on_preview(self, node_id: str, value: int, total: int, image: bytes) -> None:
        """A live preview of the running sampler's step (after its ``progress``, as ComfyUI sends them): the host
        sends it on as binary WebSocket frames (``server.websocket``) or writes it (``run --preview``)."""
        self.emit(PREVIEW_EVENT, {"prompt_id": self.prompt_id, "node": node_id, "value": value, "max": total,
                                  "image": image, "image_type": "image/jpeg"})

    def _on_work(self, node_id: str, label: str, value: int, total: int) -> None:
        """Work inside a node that is not a sampling step (fusing LoRA layers): ComfyUI's ``progress_state``
        message (per-node progress that clients do not read as steps), with a ``label`` saying what it is."""
        entry = {"value": value, "max": total, "state": "running", "node_id": node_id, "prompt_id": self.prompt_id,
                 "display_node_id": node_id, "parent_node_id": None, "real_node_id": node_id, "label": label}
        self.emit("progress_state", {"prompt_id": self.prompt_id, "nodes": {node_id: entry}})
        self.check_interrupted()

    def check_interrupted(self) -> None:
        if self.interrupt_event.is_set():
            raise InterruptedByUser()

    # -- the run ------------------------------------------------------------------------------------------
    def run(self, outputs: list[str]) -> ExecutionResult:
        self.emit("execution_start", {"prompt_id": self.prompt_id}, status_message=True)
        cache = self.executor.output_cache
        self.keys = node_signatures(self.prompt, self.definitions, self._is_changed_values(), cache.interned)
        cache.retain_only(self.keys.values())
        self.executor.instances.retain_only(self.prompt)
        self.available.update(cache.hits(self.prompt, self.keys))
        self.result.cached = list(self.available)
        self.emit("execution_cached", {"nodes": list(self.result.cached), "prompt_id": self.prompt_id},
                  status_message=True)

        execution_list = ExecutionList(self.prompt, self.definitions, self.available.__contains__)
        for output_id in outputs:
            execution_list.add_node(output_id)
        failed = False
        while not execution_list.is_empty():
            try:
                node_id = execution_list.next_ready()
            except DependencyCycleError as exc:
                self._report_failure(next(iter(execution_list.pending)), exc, {}, no_traceback=True)
                failed = True
                break
            if not self._execute_node(node_id, execution_list):
                failed = True
                break
        if not failed:
            self.result.success = True
            self.emit("execution_success", {"prompt_id": self.prompt_id}, status_message=True)
        self.emit("executing", {"node": None, "prompt_id": self.prompt_id})
        return self.result

    def _is_changed_values(self) -> dict[str, Any]:
        """IS_CHANGED per node, called on the class with constants only (links are None); an exception means
        "always changed" (NaN), as in ComfyUI."""
        values: dict[str, Any] = {}
        for node_id, node in self.prompt.items():
            node_class = self.definitions.get_class(node["class_type"])
            if not hasattr(node_class, "IS_CHANGED"):
                continue
            try:
                inputs, _ = gather_inputs(node_id, node, self.definitions, None, extra_data=self.extra_data)
                results = map_over_lists(node_class, "IS_CHANGED", inputs,
                                         input_is_list=bool(getattr(node_class, "INPUT_IS_LIST", False)))
                # one call, as almost always: its value, which a cache key takes as it is when it is a plain str
                values[node_id] = results[0] if len(results) == 1 else results
            except Exception:
                values[node_id] = float("nan")
        return values

    def _outputs_of(self, node_id: str) -> list | None:
        entry = self.available.get(node_id)
        return entry.outputs if entry is not None else None

    def _execute_node(self, node_id: str, execution_list: ExecutionList) -> bool:
        """Run (or replay from cache) one node; False when the prompt must stop (error or interrupt)."""
        node = self.prompt[node_id]
        if node_id in self.available:
            entry = self.available[node_id]  # a cached output node: replay its UI like ComfyUI
            self.emit("executed", {"node": node_id, "display_node": node_id, "output": entry.ui,
                                   "prompt_id": self.prompt_id})
            if entry.ui:
                self._record_ui(node_id, entry.ui)
            execution_list.complete(node_id)
            return True

        self.emit("executing", {"node": node_id, "display_node": node_id, "prompt_id": self.prompt_id})
        self.sync.before_node(node_id)
        context = ExecutionContext(self.prompt_id, node_id, self.interrupt_event, self._on_progress, self._on_work,
                                   previews=self.previews, on_preview=self._on_preview)
        token = set_current_context(context)
        try:
            with self.executor.node_turn():
                return self._call_node(node_id, node, execution_list)
        finally:
            reset_current_context(token)

    def _call_node(self, node_id: str, node: dict, execution_list: ExecutionList) -> bool:
        """Gather the inputs, run the node (or find it waits for lazy inputs), keep its outputs; False on failure."""
        class_type = node["class_type"]
        node_class = self.definitions.get_class(class_type)
        values: dict[str, list] = {}
        try:
            values, missing = gather_inputs(node_id, node, self.definitions, self._outputs_of,
                                            prompt=self.prompt, extra_data=self.extra_data)
            instance = self.executor.instances.get_or_create(node_id, class_type, node_class)
            input_is_list = bool(getattr(node_class, "INPUT_IS_LIST", False))
            if hasattr(instance, "check_lazy_status"):
                requested = map_over_lists(instance, "check_lazy_status", values, input_is_list=input_is_list,
                                           before_call=self.check_interrupted)
                needed = {name for names in requested if isinstance(names, list) for name in names
                          if isinstance(name, str) and (name not in values or name in missing)}
                if needed:
                    for name in sorted(needed):
                        execution_list.make_input_strong_link(node_id, name)
                    return True  # pending: runs again once the requested inputs exist
            function_name = node_class.FUNCTION
            returns = map_over_lists(instance, function_name, values, input_is_list=input_is_list,
                                     before_call=self.check_interrupted)
            outputs, ui = shape_returns(returns, node_class, node_id, class_type)
        except Exception as exc:
            self._report_failure(node_id, exc, values)
            return False

        entry = CacheEntry(outputs, ui or None)
        self.available[node_id] = entry
        self.executor.output_cache.put(self.keys[node_id], entry)
        if ui:
            self._record_ui(node_id, ui)
            self.emit("executed", {"node": node_id, "display_node": node_id, "output": ui,
                                   "prompt_id": self.prompt_id})
        self.result.executed.append(node_id)
        execution_list.complete(node_id)
        return True

    def _record_ui(self, node_id: str, ui: dict) -> None:
        self.result.outputs[node_id] = ui
        self.result.meta[node_id] = node_meta(node_id)

    def _report_failure(self, node_id: str, exc: BaseException, values: dict, *, no_traceback=False) -> None:
        base = {"prompt_id": self.prompt_id, "node_id": node_id, "node_type": self.prompt[node_id]["class_type"],
                "executed": list(self.result.executed)}
        if isinstance(exc, InterruptedByUser):
            self.result.interrupted = True
            self.emit("execution_interrupted", base, status_message=True)
            return
        exception_type = getattr(exc, "exception_type_name", None) or full_type_name(type(exc))
        error = {
            **base,
            "exception_message": f"{exc}\n",
            "exception_type": exception_type,
            "traceback": [] if no_traceback else traceback.format_tb(exc.__traceback__),
            "current_inputs": {name: [format_value(v) for v in vals] for name, vals in values.items()},
            "current_outputs": list(self.prompt),
        }
        self.emit("execution_error", error, status_message=True)
        self.sync.node_failed(node_id, error["node_type"], error["exception_message"])
        self.result.error = self.result.messages[-1][1]
