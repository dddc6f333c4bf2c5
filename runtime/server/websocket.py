"""WebSocket clients: the registry, thread-safe sending from the worker, and the ``/ws`` handler.

Why a per-socket outbox: the worker thread produces events while the event loop owns the sockets. Every send
is handed to the loop with ``call_soon_threadsafe`` (FIFO, so per-client order is the production order) and
put in that socket's queue; one writer task per socket drains it. A slow or vanished client therefore never
blocks the worker or other clients, and messages for a client that is not connected are dropped — exactly
ComfyUI's behaviour (queued work keeps running; a reconnecting client learns the state from ``status``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Callable, Optional

from aiohttp import WSMsgType, web

from ...loaders import json_limits

log = logging.getLogger("lorabind.server")

_CLOSE = object()  # outbox sentinel: stop the writer task


def _message(event: str, data: dict) -> str:
    """ComfyUI's WebSocket text frame; values from node ui dicts that JSON cannot hold are rendered with str."""
    return json.dumps({"type": event, "data": data}, default=str)


class _Client:
    def __init__(self, ws: web.WebSocketResponse):
        self.ws = ws
        self.outbox: asyncio.Queue = asyncio.Queue()


class ClientRegistry:
    """Sockets by client id (``sid``); a reconnect with the same id replaces the old socket."""

    def __init__(self, status_payload: Callable[[], dict], feature_flags: Callable[[], dict]):
        self._clients: dict[str, _Client] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._status_payload = status_payload
        self._feature_flags = feature_flags
        self.running_node: Callable[[str], Optional[str]] = lambda sid: None
        # called with (event, data) for every execution message, sent or not (the client may not be connected):
        # how the OpenAI-style video status learns a job's progress
        self.observers: list[Callable[[str, dict], None]] = []

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # -- sending (any thread) -------------------------------------------------------------------------
    def send(self, event: str, data: dict, sid: Optional[str]) -> None:
        """Send to one client; ``sid=None`` means every connected client (ComfyUI's broadcast)."""
        for observer in list(self.observers):
            observer(event, data)
        if self._loop is None or self._loop.is_closed():
            return
        try:
            self._loop.call_soon_threadsafe(self._enqueue, _message(event, data), sid)
        except RuntimeError:  # loop shut down between the check and the call (server stopping)
            pass

    def broadcast_status(self) -> None:
        self.send("status", {"status": self._status_payload()}, None)

    def _enqueue(self, message: str, sid: Optional[str]) -> None:
        targets = self._clients.values() if sid is None else filter(None, [self._clients.get(sid)])
        for client in list(targets):
            client.outbox.put_nowait(message)

    # -- the /ws handler (event loop) -----------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.query.get("clientId") or uuid.uuid4().hex
        previous = self._clients.get(sid)
        if previous is not None:
            previous.outbox.put_nowait(_CLOSE)
        client = _Client(ws)
        self._clients[sid] = client
        writer = asyncio.ensure_future(self._write_loop(client))
        try:
            client.outbox.put_nowait(_message("status", {"status": self._status_payload(), "sid": sid}))
            node = self.running_node(sid)
            if node is not None:
                client.outbox.put_nowait(_message("executing", {"node": node}))
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_client_message(client, msg.data)
                elif msg.type == WSMsgType.ERROR:
                    log.debug("websocket %s closed with %s", sid, ws.exception())
        finally:
            if self._clients.get(sid) is client:
                del self._clients[sid]
            client.outbox.put_nowait(_CLOSE)
            await writer
        return ws

    def _on_client_message(self, client: _Client, text: str) -> None:
        """Clients may announce feature flags; we answer with ours. Anything else is ignored, as ComfyUI does."""
        try:
            message = json_limits.loads(text)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("type") == "feature_flags":
            client.outbox.put_nowait(_message("feature_flags", self._feature_flags()))

    async def _write_loop(self, client: _Client) -> None:
        while True:
            message = await client.outbox.get()
            if message is _CLOSE:
                break
            if client.ws.closed:
                continue
            try:
                await client.ws.send_str(message)
            except (ConnectionError, RuntimeError) as exc:  # peer vanished mid-send: drop, keep serving
                log.debug("websocket send failed: %s", exc)
        if not client.ws.closed:
            await client.ws.close()

    async def close_all(self) -> None:
        for client in list(self._clients.values()):
            await client.ws.close()
