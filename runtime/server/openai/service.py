"""What the ``/v1`` route modules share: the served templates (``OpenAIService``, on the app) and reading a
request body into a dict, with errors in OpenAI's shape."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from aiohttp import web

from ..composition_root import STATE_KEY, ServerState
from ..http_json import read_json_body
from .errors import OpenAIRequestError
from .jobs import JobWatcher
from .templates import Template


@dataclass
class OpenAIService:
    """The served templates and the watcher that tells a waiting request its prompt has finished."""

    models: dict[str, Template]
    watcher: JobWatcher
    lines: list[str] = field(default_factory=list)  # printed by ``lorabind serve`` at start
    started: int = field(default_factory=lambda: int(time.time()))


OPENAI_KEY = web.AppKey("lorabind_openai", OpenAIService)


def service_of(request: web.Request) -> tuple[OpenAIService, ServerState]:
    return request.app[OPENAI_KEY], request.app[STATE_KEY]


async def read_body(request: web.Request) -> dict:
    """The JSON object, or the multipart/urlencoded form (``a[b]`` keys nested one level); errors as OpenAI's."""
    try:
        if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
            return _nested(await request.post())
        return await read_json_body(request)
    except web.HTTPException as exc:
        try:
            message = json.loads(exc.text or "")["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise OpenAIRequestError(message, status=exc.status if exc.status in (400, 413) else 400) from None


def _nested(form) -> dict:
    body: dict = {}
    for key, value in form.items():
        if not isinstance(value, str):
            raise OpenAIRequestError(f"{key}: file uploads are not supported; send the field as text", param=key)
        outer, bracket, inner = key.partition("[")
        if bracket and inner.endswith("]"):
            body.setdefault(outer, {})[inner[:-1]] = value
        else:
            body[key] = value
    return body


def origin(request: web.Request) -> str:
    """Where the client reached us: ``url`` answers and video links point back here."""
    return f"{request.scheme}://{request.host}"
