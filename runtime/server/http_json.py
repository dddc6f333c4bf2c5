"""JSON request/response helpers shared by the route modules: strict body parsing and ComfyUI error bodies."""

from __future__ import annotations

import json

from aiohttp import web

from ...loaders import json_limits


async def read_json_body(request: web.Request, *, default=None):
    """Parse the JSON body; malformed JSON or a non-object raises a 400 naming the problem."""
    raw = await request.read()
    if not raw.strip():
        if default is not None:
            return default
        raise bad_request("invalid_json", "Request body is empty; expected a JSON object.")
    try:
        data = json_limits.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request("invalid_json", f"Request body is not valid JSON: {exc}")
    if not isinstance(data, dict):
        raise bad_request("invalid_json", f"Request body must be a JSON object, got {type(data).__name__}.")
    return data


def bad_request(error_type: str, message: str, details: str = "", status: int = 400) -> web.HTTPException:
    """An HTTP error carrying ComfyUI's ``{"error": {...}, "node_errors": {}}`` body."""
    body = {"error": {"type": error_type, "message": message, "details": details or message, "extra_info": {}},
            "node_errors": {}}
    cls = {400: web.HTTPBadRequest, 403: web.HTTPForbidden, 404: web.HTTPNotFound}[status]
    return cls(text=json.dumps(body), content_type="application/json")


def dumps(obj) -> str:
    """JSON for responses that may carry non-JSON values from node ui dicts (rendered with ``str``)."""
    return json.dumps(obj, default=str)
