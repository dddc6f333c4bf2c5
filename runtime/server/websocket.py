"""WebSocket clients: the registry, thread-safe sending from the worker, and the ``/ws`` handler.

Why a per-socket outbox: the worker thread produces events while the event loop owns the sockets. Every send
is handed to the loop with ``call_soon_threadsafe`` (FIFO, so per-client order is the production order) and
put in that socket's queue; one writer task per socket drains it. A slow or vanished client therefore never
blocks the worker or other clients, and messages for a client that is not connected are dropped — exactly
ComfyUI's behaviour (queued work keeps running; a reconnecting client learns the state from ``status``).

Why registration: client ids are visible to everyone in ``/queue`` and ``/history``, and in ComfyUI whoever
connects with an id receives its events. Here the first connection with an id registers it and gets a token in
its first message (``status``: ``sid`` and ``client_token``). While that connection is open, or prompts queued
under the id are pending or running, another connection gets the id only with ``&clientToken=<token>``; without
it, it is given a fresh id in ``sid``, which ComfyUI's clients adopt, so they keep working: they just never
receive another client's events. Once the owner is gone and its prompts are done the id is free again, so a
script that connects with the same fixed id on every run keeps working.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import struct
import uuid
from collections import OrderedDict
from typing import Callable, Optional

from aiohttp import WSMsgType, web

from ...loaders.io import json_limits
from ..preview_options import PREVIEW_EVENT
from . import identifiers

log = logging.getLogger("lorabind.server")

_CLOSE = object()  # outbox sentinel: stop the writer task
# Clients send only small control messages (feature_flags), parsed on the event loop: aiohttp's default 4 MB of
# small JSON objects would hold it for seconds. A larger message closes the socket (code 1009).
MAX_CLIENT_MESSAGE_BYTES = 256 * 1024
MAX_REGISTRATIONS = 10_000  # ids remembered once their connection is gone (oldest forgotten first)


def _message(event: str, data: dict) -> str:
    """ComfyUI's WebSocket text frame; values from node ui dicts that JSON cannot hold are rendered with str."""
    return json.dumps({"type": event, "data": data}, default=str)


# ComfyUI's binary event types (its protocol.BinaryEventTypes) and PREVIEW_IMAGE's image types
PREVIEW_IMAGE, PREVIEW_IMAGE_WITH_METADATA, JPEG = 1, 4, 1


def preview_frame(preview: dict, with_metadata: bool) -> bytes:
    """A live preview (the executor's ``PREVIEW_EVENT`` data) in ComfyUI's byte layout: the 4-byte big-endian event
    type, then PREVIEW_IMAGE's 4-byte image type and the JPEG, or, for a client that announced
    ``supports_preview_metadata``, the 4-byte length of a JSON object naming the node and prompt, that JSON and the
    JPEG (the frontend shows it on that node)."""
    if not with_metadata:
        return struct.pack(">II", PREVIEW_IMAGE, JPEG) + preview["image"]
    node = preview["node"]
    metadata = json.dumps({"node_id": node, "prompt_id": preview["prompt_id"], "display_node_id": node,
                           "parent_node_id": None, "real_node_id": node,
                           "image_type": preview["image_type"]}).encode()
    return struct.pack(">II", PREVIEW_IMAGE_WITH_METADATA, len(metadata)) + metadata + preview["image"]


class _Client:
    def __init__(self, ws: web.WebSocketResponse):
        self.ws = ws
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.preview_metadata = False  # the client announced supports_preview_metadata


class ClientRegistry:
    """Sockets by client id (``sid``); a reconnect with the same id replaces the old socket."""

    def __init__(self, status_payload: Callable[[], dict], feature_flags: Callable[[], dict]):
        self._clients: dict[str, _Client] = {}
        self._tokens: OrderedDict[str, str] = OrderedDict()  # client id -> token of the connection that registered it
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._status_payload = status_payload
        self._feature_flags = feature_flags
        self.running_node: Callable[[str], Optional[str]] = lambda sid: None
        self.has_prompts: Callable[[str], bool] = lambda sid: False  # queued or running under this client id
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
            if event == PREVIEW_EVENT:  # binary, and its form depends on what each client announced
                self._loop.call_soon_threadsafe(self._enqueue_preview, data, sid)
            else:
                self._loop.call_soon_threadsafe(self._enqueue, _message(event, data), sid)
        except RuntimeError:  # loop shut down between the check and the call (server stopping)
            pass

    def broadcast_status(self) -> None:
        self.send("status", {"status": self._status_payload()}, None)

    def _targets(self, sid: Optional[str]) -> list:
        return list(self._clients.values() if sid is None else filter(None, [self._clients.get(sid)]))

    def _enqueue(self, message: str, sid: Optional[str]) -> None:
        for client in self._targets(sid):
            client.outbox.put_nowait(message)

    def _enqueue_preview(self, preview: dict, sid: Optional[str]) -> None:
        for client in self._targets(sid):
            client.outbox.put_nowait(preview_frame(preview, client.preview_metadata))

    # -- the /ws handler (event loop) -----------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_CLIENT_MESSAGE_BYTES)
        await ws.prepare(request)
        sid, token = self._register(request.query.get("clientId"), request.query.get("clientToken"))
        previous = self._clients.get(sid)
        if previous is not None:
            previous.outbox.put_nowait(_CLOSE)
        client = _Client(ws)
        self._clients[sid] = client
        writer = asyncio.ensure_future(self._write_loop(client))
        try:
            client.outbox.put_nowait(_message("status", {"status": self._status_payload(), "sid": sid,
                                                          "client_token": token}))
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

    def _register(self, requested: Optional[str], token: Optional[str]) -> tuple[str, str]:
        """(client id, token) for a new connection: the requested id when it is free (first come, or its owner
        is gone and has no prompts left) or the token matches its registration; otherwise a fresh id."""
        if identifiers.is_well_formed(requested):
            known = self._tokens.get(requested)
            if known is None or (requested not in self._clients and not self.has_prompts(requested)):
                return requested, self._new_registration(requested)
            if token is not None and hmac.compare_digest(known, token):
                self._tokens.move_to_end(requested)
                return requested, known
            log.info("websocket asked for client id %s without its token; given a fresh id", requested)
        sid = uuid.uuid4().hex
        return sid, self._new_registration(sid)

    def _new_registration(self, sid: str) -> str:
        token = secrets.token_urlsafe(24)
        self._tokens[sid] = token
        if len(self._tokens) > MAX_REGISTRATIONS:  # forget the oldest ids nobody is connected with
            idle = [known for known in self._tokens if known not in self._clients and known != sid]
            for known in idle[:len(self._tokens) - MAX_REGISTRATIONS]:
                del self._tokens[known]
        return token

    def _on_client_message(self, client: _Client, text: str) -> None:
        """Clients may announce feature flags; we answer with ours. Anything else is ignored, as ComfyUI does."""
        try:
            message = json_limits.loads(text)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("type") == "feature_flags":
            flags = message.get("data")
            client.preview_metadata = isinstance(flags, dict) and flags.get("supports_preview_metadata") is True
            client.outbox.put_nowait(_message("feature_flags", self._feature_flags()))

    async def _write_loop(self, client: _Client) -> None:
        while True:
            message = await client.outbox.get()
            if message is _CLOSE:
                break
            if client.ws.closed:
                continue
            try:
                if isinstance(message, bytes):
                    await client.ws.send_bytes(message)
                else:
                    await client.ws.send_str(message)
            except (ConnectionError, RuntimeError) as exc:  # peer vanished mid-send: drop, keep serving
                log.debug("websocket send failed: %s", exc)
        if not client.ws.closed:
            await client.ws.close()

    async def close_all(self) -> None:
        for client in list(self._clients.values()):
            await client.ws.close()
