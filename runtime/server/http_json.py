"""JSON request/response helpers shared by the route modules: bounded body reading, JSON parsing off the event
loop, and ComfyUI error bodies."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

from aiohttp import web

from ...loaders.io import json_limits
from .composition_root import STATE_KEY

_CHUNK_BYTES = 64 * 1024


async def read_bounded_body(request: web.Request, limit: int, values: Optional[json_limits.ValueCount] = None) -> bytes:
    """The raw body, 413 past ``limit`` bytes (the declared length first, then what arrives) or, with ``values``,
    past its bound on JSON values. Counted chunk by chunk as they arrive, so a refused body is never read whole."""
    if request.content_length is not None and request.content_length > limit:
        raise too_large(f"Request body of {request.content_length} bytes is over the limit of {limit} bytes.")
    body = bytearray()
    async for chunk in request.content.iter_chunked(_CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            raise too_large(f"Request body is over the limit of {limit} bytes.")
        if values is not None and not values.add(chunk):
            raise too_large(f"Request body holds more than {values.limit} JSON values (counting commas and "
                            "brackets); no workflow comes near that.")
    return bytes(body)


async def read_json_body(request: web.Request, *, default=None, limit: Optional[int] = None):
    """Parse the JSON body, within budgets, off the event loop; malformed JSON or a non-object raises a 400.

    The budgets: ``limit`` bytes (default: the server's upload limit), ``json_limits.MAX_JSON_VALUES`` values,
    ``json_limits.MAX_JSON_DEPTH`` levels. Parsing and the depth walk run in a thread, so another request waits
    at most for one bounded parse."""
    if limit is None:
        limit = request.app[STATE_KEY].config.max_upload_bytes
    raw = await read_bounded_body(request, limit, json_limits.ValueCount())
    if not raw.strip():
        if default is not None:
            return default
        raise bad_request("invalid_json", "Request body is empty; expected a JSON object.")
    data = await parse_json(raw)
    if not isinstance(data, dict):
        raise bad_request("invalid_json", f"Request body must be a JSON object, got {type(data).__name__}.")
    return data


async def parse_json(raw: bytes):
    """``json_limits.loads`` in a thread; a 400 naming the problem for malformed or too deeply nested JSON."""
    try:
        return await asyncio.to_thread(json_limits.loads, raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request("invalid_json", f"Request body is not valid JSON: {exc}") from None


def _error_body(error_type: str, message: str, details: str = "") -> str:
    return json.dumps({"error": {"type": error_type, "message": message, "details": details or message,
                                 "extra_info": {}}, "node_errors": {}})


def bad_request(error_type: str, message: str, details: str = "", status: int = 400) -> web.HTTPException:
    """An HTTP error carrying ComfyUI's ``{"error": {...}, "node_errors": {}}`` body."""
    cls = {400: web.HTTPBadRequest, 403: web.HTTPForbidden, 404: web.HTTPNotFound, 409: web.HTTPConflict,
           500: web.HTTPInternalServerError}[status]
    return cls(text=_error_body(error_type, message, details), content_type="application/json")


def too_large(message: str) -> web.HTTPException:
    """413 with the same JSON error body (aiohttp's own 413 is a bare text page)."""
    return web.HTTPRequestEntityTooLarge(max_size=0, actual_size=0, text=_error_body("too_large", message),
                                         content_type="application/json")


def dumps(obj) -> str:
    """JSON for responses that may carry non-JSON values from node ui dicts (rendered with ``str``)."""
    return json.dumps(obj, default=str)
