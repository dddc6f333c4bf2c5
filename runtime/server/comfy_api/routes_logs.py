"""The editor's Logs panel: ``GET /internal/logs/raw`` and ``PATCH /internal/logs/subscribe`` (ComfyUI's
``app/logger.py`` + ``api_server/routes/internal``), fed by the server's own log lines.

Why (issue 30): the frontend we serve (1.58.1) opens its bottom-panel console with ``/internal/logs/raw``; any
answer but JSON makes it print "Unable to load logs, please ensure you have updated your ComfyUI backend.", advice
that does not apply here. That is the frontend's only backend check on this panel (its version check reads
``required_frontend_version`` from ``/system_stats``, which this server, hosting the pinned frontend itself,
does not set). So we answer with what there is to show: the server's per-prompt lines (queued, started,
finished, failed) and warnings, the ones ``lorabind serve`` prints on stderr, the last ``MAX_ENTRIES`` of them.
"""

from __future__ import annotations

import collections
import datetime
import logging
import threading

from aiohttp import web

from ..composition_root import ServerState
from ..http_json import bad_request, read_json_body

MAX_ENTRIES = 300  # ComfyUI keeps the last 300 lines too
TERMINAL_SIZE = {"cols": 120, "rows": 30}  # ComfyUI reports its console's; the panel does not read it
SERVER_LOGGER = "lorabind.server"


class ServerLogBuffer(logging.Handler):
    """The last lines of the server's logger, and the WebSocket clients that asked to be sent new ones."""

    def __init__(self, send):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        self._entries = collections.deque(maxlen=MAX_ENTRIES)
        self._subscribers: set[str] = set()
        self._lock = threading.Lock()
        self._send = send  # ClientRegistry.send(event, data, client id)

    def emit(self, record: logging.LogRecord) -> None:
        entry = {"t": datetime.datetime.fromtimestamp(record.created).isoformat(), "m": self.format(record) + "\n"}
        with self._lock:
            self._entries.append(entry)
            subscribers = list(self._subscribers)
        for client_id in subscribers:
            self._send("logs", {"entries": [entry], "size": TERMINAL_SIZE}, client_id)

    def entries(self) -> list[dict]:
        with self._lock:
            return list(self._entries)

    def subscribe(self, client_id: str, enabled: bool) -> None:
        with self._lock:
            (self._subscribers.add if enabled else self._subscribers.discard)(client_id)


LOG_BUFFER_KEY = web.AppKey("lorabind_log_buffer", ServerLogBuffer)


def add_log_routes(app: web.Application, state: ServerState) -> None:
    """Attach the buffer to the server's logger for the app's lifetime and answer the panel's two calls."""
    buffer = ServerLogBuffer(state.clients.send)
    app[LOG_BUFFER_KEY] = buffer
    logger = logging.getLogger(SERVER_LOGGER)
    logger.addHandler(buffer)
    if logger.level == logging.NOTSET:  # `serve` sets INFO; an embedding test may not have
        logger.setLevel(logging.INFO)

    async def detach(app: web.Application) -> None:
        logger.removeHandler(buffer)

    app.on_cleanup.append(detach)
    app.router.add_get("/internal/logs/raw", get_raw_logs)
    app.router.add_patch("/internal/logs/subscribe", patch_subscribe)


async def get_raw_logs(request: web.Request) -> web.Response:
    return web.json_response({"entries": request.app[LOG_BUFFER_KEY].entries(), "size": TERMINAL_SIZE})


async def patch_subscribe(request: web.Request) -> web.Response:
    body = await read_json_body(request)
    client_id = body.get("clientId")
    if not isinstance(client_id, str) or not client_id:
        raise bad_request("invalid_request", "Field 'clientId' must be the WebSocket's client id.")
    request.app[LOG_BUFFER_KEY].subscribe(client_id, bool(body.get("enabled")))
    return web.Response(status=200)

