"""Queue and history routes: ``/prompt``, ``/queue``, ``/interrupt``, ``/history``, ``/free``.

Payload shapes are ComfyUI's (comfyui.md §4.2) so its Python clients and frontend work unchanged.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid

from aiohttp import web

from ...workflow_format import WorkflowFormatError, to_api_prompt
from .. import identifiers, prompt_log
from ..composition_root import STATE_KEY, ServerState
from ..history import SENSITIVE_EXTRA_DATA_KEYS
from ..http_json import bad_request, dumps, read_json_body, too_large
from ..queue import QueueItem
from .prompt_service import validate_prompt

MAX_EXTRA_DATA_BYTES = 8 * 1024 * 1024


def register(routes: web.RouteTableDef) -> None:
    routes.post("/prompt")(post_prompt)
    routes.get("/prompt")(get_prompt)
    routes.get("/queue")(get_queue)
    routes.post("/queue")(post_queue)
    routes.post("/interrupt")(post_interrupt)
    routes.get("/history")(get_history)
    routes.get("/history/{prompt_id}")(get_history_item)
    routes.post("/history")(post_history)
    routes.post("/free")(post_free)


def _state(request: web.Request) -> ServerState:
    return request.app[STATE_KEY]


def _is_ui_workflow(prompt) -> bool:
    return isinstance(prompt, dict) and isinstance(prompt.get("nodes"), list)


def _to_api_prompt(state: ServerState, workflow: dict) -> dict:
    try:
        prompt, _ = to_api_prompt(workflow, state.node_classes, state.display_names)
    except WorkflowFormatError as exc:  # names the node id and type
        raise bad_request("invalid_prompt", f"Cannot convert the UI workflow to an API prompt: {exc}") from None
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # a malformed workflow is the client's error
        raise bad_request("invalid_prompt", f"Malformed UI workflow ({type(exc).__name__}: {exc}); expected "
                          "ComfyUI's workflow JSON with 'nodes' (each with id, type, widgets_values) and 'links'.") from None
    return prompt


async def post_prompt(request: web.Request) -> web.Response:
    try:
        return await _post_prompt(request)
    except web.HTTPBadRequest as exc:  # refused before validation (the body's shape, the id): logged as well
        prompt_log.refused_unread(_error_type(exc))
        raise


def _error_type(exc: web.HTTPException) -> str:
    try:
        return str(json.loads(exc.text or "{}")["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return "bad_request"


async def _post_prompt(request: web.Request) -> web.Response:
    state = _state(request)
    body = await read_json_body(request)
    if "prompt" not in body:
        raise bad_request("no_prompt", "No prompt provided", _no_prompt_details(body))
    prompt = body["prompt"]
    loop = asyncio.get_running_loop()
    if _is_ui_workflow(prompt):
        prompt = await loop.run_in_executor(state.validation_pool, _to_api_prompt, state, prompt)
    if not isinstance(prompt, dict) or not all(isinstance(node, dict) for node in prompt.values()):
        raise bad_request("invalid_prompt", "Field 'prompt' must be an object mapping node ids to "
                          "{class_type, inputs} objects (API format) or a UI workflow.")
    extra_data = await _extra_data(body)
    targets = body.get("partial_execution_targets")
    if targets is not None and not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise bad_request("invalid_prompt", "Field 'partial_execution_targets' must be a list of node ids.")
    number = state.queue.next_number(_explicit_number(body), front=bool(body.get("front")))
    prompt_id = _claim_prompt_id(state, body.get("prompt_id"))
    try:
        result = await loop.run_in_executor(state.validation_pool, validate_prompt, state, prompt, targets)
        if not result.ok:
            prompt_log.refused(prompt_id, result.error, result.node_errors, extra_data.get("client_id"))
            return web.json_response({"error": result.error, "node_errors": result.node_errors}, status=400)
        sensitive = {key: extra_data.pop(key) for key in SENSITIVE_EXTRA_DATA_KEYS if key in extra_data}
        # logged before it is queued: the worker may start it at once, and "started" must follow "queued"
        prompt_log.queued(prompt_id, number, len(prompt), extra_data.get("client_id"), state.queue.background)
        state.queue.put(QueueItem(number, prompt_id, prompt, extra_data, list(result.outputs), sensitive))
    finally:
        state.queue.release(prompt_id)  # a no-op once queued; frees the id of a refused prompt
    return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": result.node_errors})


def _claim_prompt_id(state: ServerState, requested) -> str:
    """The server's own UUID, or the client's id when it is well formed and new (not pending, running, in the
    history or being validated): a reused id would overwrite another client's history entry."""
    if requested is None or requested == "":
        prompt_id = str(uuid.uuid4())
        state.queue.claim(prompt_id)
        return prompt_id
    if not identifiers.is_well_formed(requested):
        raise bad_request("invalid_prompt", f"Field 'prompt_id' must be {identifiers.RULE}, got "
                          f"{str(requested)[:80]!r}; leave it out and the server assigns one.")
    if state.history.contains(requested) or not state.queue.claim(requested):
        raise bad_request("invalid_prompt", f"prompt_id {requested!r} is already in use (queued, running or in the "
                          "history); send a new one, or leave it out and the server assigns one.")
    return requested


def _explicit_number(body: dict):
    """The client's ``number`` (its queue position), None when absent; 400 unless a finite number."""
    if "number" not in body:
        return None
    try:
        explicit = float(body["number"])
    except (TypeError, ValueError):
        explicit = math.nan
    if not math.isfinite(explicit):  # inf/nan would break the queue order and JSON
        raise bad_request("invalid_prompt", f"Field 'number' must be a finite number, got {body['number']!r}.")
    return explicit


async def _extra_data(body: dict) -> dict:
    """A copy of ``extra_data`` with ``create_time`` and the well-formed ``client_id``, bounded in bytes: it is
    kept in the history (in memory and on disk) for as long as the entry lives."""
    extra_data = body.get("extra_data") or {}
    if not isinstance(extra_data, dict):
        raise bad_request("invalid_prompt", "Field 'extra_data' must be an object.")
    size = len(await asyncio.to_thread(dumps, extra_data))
    if size > MAX_EXTRA_DATA_BYTES:
        raise too_large(f"Field 'extra_data' has {size} bytes of JSON, over the limit of {MAX_EXTRA_DATA_BYTES}; "
                        "a UI workflow is a few hundred KB.")
    extra_data = dict(extra_data)
    extra_data["create_time"] = int(time.time() * 1000)  # as ComfyUI: the jobs list sorts and shows it
    client_id = body.get("client_id")
    if client_id:
        if not identifiers.is_well_formed(client_id):
            raise bad_request("invalid_prompt", f"Field 'client_id' must be {identifiers.RULE}, got "
                              f"{str(client_id)[:80]!r}.")
        extra_data["client_id"] = client_id
    return extra_data


def _no_prompt_details(body) -> str:
    """The details under ComfyUI's "No prompt provided": what the body must look like, and the most common slip,
    POSTing a saved ``.api.json`` (or UI workflow) file as it is, without the wrapper."""
    shape = ('the body must be {"prompt": <API prompt or UI workflow>, "client_id": "<your id>"} '
             '(client_id is optional; it routes the WebSocket messages to you)')
    looks_like_prompt = isinstance(body, dict) and body and all(
        isinstance(node, dict) and "class_type" in node for node in body.values())
    if looks_like_prompt or _is_ui_workflow(body):
        return f"This body looks like a workflow file sent as it is; {shape}"
    return shape[0].upper() + shape[1:]


async def get_prompt(request: web.Request) -> web.Response:
    return web.json_response(_state(request).status_payload())


async def get_queue(request: web.Request) -> web.Response:
    queue = _state(request).queue
    running, pending = queue.snapshot()
    # ComfyUI's two lists, and what holds the pending prompts back when no prompt runs (a template thumbnail)
    return web.json_response({"queue_running": running, "queue_pending": pending,
                              "lorabind_background": queue.background})


async def post_queue(request: web.Request) -> web.Response:
    state = _state(request)
    body = await read_json_body(request)
    if body.get("clear"):
        state.queue.clear()
    if "delete" in body:
        state.queue.delete(_id_list(body["delete"], "delete"))
    return web.Response(status=200)


async def post_interrupt(request: web.Request) -> web.Response:
    """Interrupt the running prompt, or only ``prompt_id`` if given. An empty body is the global interrupt."""
    body = await read_json_body(request, default={})
    prompt_id = body.get("prompt_id")
    _state(request).worker.interrupt(str(prompt_id) if prompt_id else None)
    return web.Response(status=200)


async def get_history(request: web.Request) -> web.Response:
    max_items = _int_query(request, "max_items", None)
    offset = _int_query(request, "offset", -1)
    return web.json_response(_state(request).history.list(max_items, offset), dumps=dumps)


async def get_history_item(request: web.Request) -> web.Response:
    return web.json_response(_state(request).history.get(request.match_info["prompt_id"]), dumps=dumps)


async def post_history(request: web.Request) -> web.Response:
    history = _state(request).history
    body = await read_json_body(request)
    if body.get("clear"):
        await asyncio.to_thread(history.clear)
    if "delete" in body:
        await asyncio.to_thread(history.delete, _id_list(body["delete"], "delete"))
    return web.Response(status=200)


async def post_free(request: web.Request) -> web.Response:
    body = await read_json_body(request, default={})
    _state(request).worker.request_free(body.get("unload_models", False), body.get("free_memory", False))
    return web.Response(status=200)


def _id_list(value, field: str) -> list[str]:
    if not isinstance(value, list):
        raise bad_request("invalid_request", f"Field '{field}' must be a list of prompt ids.")
    return [str(v) for v in value]


def _int_query(request: web.Request, name: str, default):
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise bad_request("invalid_request", f"Query parameter '{name}' must be an integer, got {raw!r}.") from None
