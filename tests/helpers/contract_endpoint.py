"""Ask ``GET /lorabind/contract`` through a bare aiohttp app holding only that route (no server state needed)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from lorabind.nodes.editor_routes import CONTRACT_PATH, get_declared_contract


def ask_contracts(names: list[str], folder: str = "loras") -> list[tuple[int, dict]]:
    """(status, JSON body) for each name, asked in order on one client."""
    app = web.Application()
    app.router.add_get(CONTRACT_PATH, get_declared_contract)

    async def ask():
        async with TestClient(TestServer(app)) as client:
            answers = []
            for name in names:
                response = await client.get(CONTRACT_PATH, params={"name": name, "folder": folder})
                answers.append((response.status, await response.json()))
            return answers

    return asyncio.run(ask())
