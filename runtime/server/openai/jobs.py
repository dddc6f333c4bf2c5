"""Queue a filled-in template exactly like ``POST /prompt`` does, and learn when it finished and how far it got.

Why here and not a second executor: the prompt goes through the same validation, the same ``PromptQueue`` and
the same worker, so it shows up in ``/queue`` and ``/history``, streams progress on the WebSocket to its
``client_id``, can be interrupted with ``POST /interrupt``, and runs on a Ray replica under ``--ray``. Waiting
uses the history store's listener (the entry is written when the prompt ends), progress the execution events.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Optional

from ...preview_options import PREVIEW_EVENT
from .. import prompt_log
from ..comfy_api.prompt_service import CONTRACT_MISMATCH, REFUSAL_KEY, validate_prompt
from ..composition_root import ServerState
from ..queue import QueueItem
from .errors import OpenAIRequestError
from .templates import ADAPTER_NODE, Template

OPENAI_EXTRA_KEY = "lorabind_openai"  # extra_data entry describing the request (kept in /queue and /history)
_MAX_TRACKED = 10000  # progress entries kept for jobs nobody asked about (bounded like the history)
_MAX_PREVIEWS = 64  # latest previews kept (one per running prompt; each at most --preview-size pixels)


class JobWatcher:
    """Futures resolved when a prompt's history entry is written, and each running prompt's progress: the step of
    its running sampler and, when the server previews steps, that step's latest preview."""

    def __init__(self, state: ServerState):
        self.state = state
        self._lock = threading.Lock()
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}
        self._progress: dict[str, tuple] = {}  # prompt id -> (step, steps)
        self._previews: dict[str, tuple] = {}  # prompt id -> (JPEG bytes, step, media type)
        state.history.listeners.append(self._finished)
        state.clients.observers.append(self._event)

    def watch(self, prompt_id: str) -> asyncio.Future:
        """A future for ``prompt_id``'s history entry; take it before queueing so the end cannot be missed."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._waiters.setdefault(prompt_id, []).append((loop, future))
        return future

    def progress(self, prompt_id: str) -> tuple:
        """(step, steps) of the prompt's running sampler, (0, 0) before its first step."""
        with self._lock:
            return self._progress.get(prompt_id, (0, 0))

    def preview(self, prompt_id: str) -> Optional[tuple]:
        """(JPEG bytes, step, media type) of the prompt's latest step preview, or None."""
        with self._lock:
            return self._previews.get(prompt_id)

    def _finished(self, prompt_id: str, entry: dict) -> None:  # worker thread
        with self._lock:
            waiters = self._waiters.pop(prompt_id, [])
            self._progress.pop(prompt_id, None)
            self._previews.pop(prompt_id, None)
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future, entry)

    def _event(self, event: str, data: dict) -> None:  # worker thread
        """Sampling steps (``progress`` carries value/max for the sampler's steps) and their previews."""
        if event not in ("progress", PREVIEW_EVENT) or not data.get("prompt_id") or not data.get("max"):
            return
        with self._lock:
            table, bound = (self._progress, _MAX_TRACKED) if event == "progress" else (self._previews, _MAX_PREVIEWS)
            if data["prompt_id"] not in table and len(table) >= bound:
                table.pop(next(iter(table)))
            table[data["prompt_id"]] = ((data["value"], data["max"]) if event == "progress"
                                        else (data["image"], data["value"], data["image_type"]))


def _resolve(future: asyncio.Future, entry: dict) -> None:
    if not future.done():
        future.set_result(entry)


async def validated(state: ServerState, template: Template, prompt: dict, sent=None,
                    client_id: Optional[str] = None):
    """``prompt``'s validation result; OpenAIRequestError (400) naming the request field (as ``sent``, the
    request's own spellings, name it) when it is refused, logged as a refusal of ``client_id``'s prompt."""
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(state.validation_pool, validate_prompt, state, prompt, None)
    if not result.ok:
        prompt_log.refused(None, result.error, result.node_errors, client_id)
        raise validation_error(template, prompt, result, sent)
    return result


async def queue_prompt(state: ServerState, watcher: JobWatcher, template: Template, prompt: dict,
                       description: dict, client_id: Optional[str], result=None) -> tuple[str, asyncio.Future]:
    """Queue ``prompt`` (validated here unless ``result`` is its validation already); returns its prompt id and
    the future of its history entry."""
    result = result or await validated(state, template, prompt, description.get("fields"), client_id)
    prompt_id = str(uuid.uuid4())
    client_id = client_id or f"openai-{prompt_id}"  # events are produced only for prompts with a client
    extra_data = {"create_time": int(time.time() * 1000), "client_id": client_id, OPENAI_EXTRA_KEY: description}
    future = watcher.watch(prompt_id)
    number = state.queue.next_number()
    prompt_log.queued(prompt_id, number, len(prompt), client_id)  # before the worker can log "started"
    state.queue.put(QueueItem(number, prompt_id, prompt, extra_data, list(result.outputs)))
    return prompt_id, future


def validation_error(template: Template, prompt: dict, result, sent=None) -> OpenAIRequestError:
    """The first node error, named by the request field that set the input (or the adapter it came from);
    ``sent``: ``GenerationRequest.sent``."""
    for node_id, node_error in (result.node_errors or {}).items():
        errors = sorted(node_error.get("errors", []), key=lambda error: not _states_own_input(error))
        for error in errors:
            input_name = (error.get("extra_info") or {}).get("input_name")
            request_field = _field_of(template, prompt, node_id, input_name, sent)
            where = f"node {node_id} ({node_error.get('class_type')}) input {input_name}"
            text = f"{error.get('message')}: {error.get('details')}" if error.get("details") else error["message"]
            prefix = f"{request_field}: " if request_field else ""
            # a contract the prompt's files declare, refused at validation (before anything runs)
            refusal = (error.get("extra_info") or {}).get(REFUSAL_KEY)
            code = CONTRACT_MISMATCH if refusal == CONTRACT_MISMATCH else None
            return OpenAIRequestError(f"{prefix}{text} ({where} of {template.file_name})", param=request_field,
                                      code=code)
    error = result.error or {}
    return OpenAIRequestError(f"{error.get('message', 'invalid prompt')}: {error.get('details', '')} "
                              f"({template.file_name})")


def _states_own_input(error: dict) -> bool:
    """A node's VALIDATE_INPUTS failure is reported once per input it takes, with one reason; the reason names
    the input at fault first (``height 100000 is outside 16..8192``)."""
    input_name = (error.get("extra_info") or {}).get("input_name")
    reason = str(error.get("details", "")).partition(" - ")[2]
    return bool(input_name) and reason.startswith(f"{input_name} ")


def _field_of(template: Template, prompt: dict, node_id: str, input_name, sent) -> Optional[str]:
    if node_id not in template.prompt:
        return "lora" if prompt.get(node_id, {}).get("class_type") == ADAPTER_NODE else None
    return template.fields_of(node_id, sent).get(input_name)


def describe_request(endpoint: str, template: Template, values: dict, sent: dict) -> dict:
    """What ``extra_data`` records of an OpenAI-style request (the video status is built from it; ``sent``:
    ``GenerationRequest.sent``, which field an error names)."""
    width, height = values.get("width", template_value(template, "width")), values.get(
        "height", template_value(template, "height"))
    return {"endpoint": endpoint, "model": template.name, "prompt": values.get("prompt"),
            "size": f"{width}x{height}" if width and height else None, "created_at": int(time.time()),
            "fields": sent}


def template_value(template: Template, request_field: str):
    return template.default_of(request_field) if request_field in template.bindings else None
