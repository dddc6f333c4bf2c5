"""A ComfyUI-style test client (real aiohttp HTTP + WebSocket) and a helper starting a real loopback server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from server_fake_nodes import FAKE_NODES


def user_folder(server: BackgroundServer) -> Path:
    """Where a server keeps its user's settings and saved workflows."""
    return Path(server.config.state_dir, "userdata")


def start_server(tmp_path, **config_kwargs) -> BackgroundServer:
    config = ServerConfig(listen="127.0.0.1", port=0, models_root=str(tmp_path / "models"),
                          output_dir=str(tmp_path / "output"), input_dir=str(tmp_path / "input"),
                          temp_dir=str(tmp_path / "temp"), **config_kwargs)
    return BackgroundServer(config, node_classes=FAKE_NODES).start()


class Client:
    """A ComfyUI-style client: one session, one WebSocket with a clientId, helpers that await messages."""

    def __init__(self, base_url: str, client_id: str = "client-a"):
        self.base_url = base_url
        self.client_id = client_id
        self.session = aiohttp.ClientSession()
        self.ws = None
        self.messages: list[dict] = []
        self.binary: list[bytes] = []  # binary frames (live previews), in the order they came

    async def connect(self, token: str | None = None) -> dict:
        """Open the WebSocket; ``token`` (the first connection's ``client_token``) takes over a registered id."""
        query = f"clientId={self.client_id}" + (f"&clientToken={token}" if token else "")
        self.ws = await self.session.ws_connect(f"{self.base_url}/ws?{query}")
        return await self.receive()

    async def receive(self, timeout: float = 30.0) -> dict:
        """The next text message; binary frames on the way (live previews) are kept in ``binary``, as ComfyUI's
        clients set them aside."""
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.ws.receive(timeout=max(deadline - time.monotonic(), 0.01))
            if msg.type == aiohttp.WSMsgType.BINARY:
                self.binary.append(msg.data)
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise TypeError(f"WebSocket message {msg.type.name} is not text ({msg.data!r})")
            message = json.loads(msg.data)
            self.messages.append(message)
            return message

    async def post(self, path: str, body, **kwargs):
        data = body if isinstance(body, (bytes, str, aiohttp.FormData)) else json.dumps(body)
        async with self.session.post(self.base_url + path, data=data, **kwargs) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text and resp.content_type == "application/json" else text)

    async def request(self, method: str, path: str, body=None):
        """Any method; a body that is not bytes or str is sent as JSON. (status, JSON or raw bytes, headers)."""
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        async with self.session.request(method, self.base_url + path, data=data) as resp:
            raw = await resp.read()
            return resp.status, (json.loads(raw) if resp.content_type == "application/json" else raw), resp.headers

    async def get(self, path: str, **kwargs):
        async with self.session.get(self.base_url + path, **kwargs) as resp:
            body = await resp.read()
            if resp.content_type == "application/json":
                return resp.status, json.loads(body)
            return resp.status, body

    async def queue_prompt(self, prompt: dict, **extra) -> dict:
        status, body = await self.post("/prompt", {"prompt": prompt, "client_id": self.client_id, **extra})
        assert status == 200, body
        return body

    async def run_and_view(self, prompt: dict, timeout: float = 300.0) -> list[tuple[str, bytes]]:
        """Queue ``prompt`` (connected), wait for its end; (file name, bytes via /view) of each image it names."""
        prompt_id = (await self.queue_prompt(prompt))["prompt_id"]
        await self.wait_done(prompt_id, timeout=timeout)
        _, history = await self.get(f"/history/{prompt_id}")
        files = []
        for image in (i for o in history[prompt_id]["outputs"].values() for i in o.get("images", [])):
            status, data = await self.get("/view", params={k: image[k] for k in ("filename", "subfolder", "type")})
            assert status == 200, data
            files.append((image["filename"], data))
        assert files, history[prompt_id]
        return files

    async def wait_done(self, prompt_id: str, timeout: float = 60.0) -> list[dict]:
        """Messages for ``prompt_id`` up to and including the final ``executing {node: null}``."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            message = await self.receive(timeout=max(deadline - time.monotonic(), 0.1))
            data = message.get("data", {})
            if data.get("prompt_id") == prompt_id:
                seen.append(message)
                if message["type"] == "executing" and data.get("node") is None:
                    return seen

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        await self.session.close()


def run_async(coro_fn, *args):
    """Run one async test body to completion (pytest-asyncio is not a dependency)."""
    return asyncio.run(coro_fn(*args))
