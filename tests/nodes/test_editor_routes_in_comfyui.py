"""Inside ComfyUI the editor's contract route is served by ComfyUI's own server: the pack adds the same handler
``lorabind serve`` uses to ``PromptServer.instance.routes``. ComfyUI is not installed here, so its ``server``
and ``folder_paths`` modules are stood in by stubs injected into ``sys.modules``."""

import asyncio
import sys
import types

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from test_comfy_bridge import _pack_loaded_by_path

from comfyui_stubs import install_comfyui_modules
from lorabind.nodes import comfy_bridge, editor_routes
from lorabind.runtime.commands.inspect import inspect_lora
from lorabind.tiny_models.lora_fixtures import PEFT_FOLDER, WAN22_HIGH


@pytest.fixture
def comfy_server(monkeypatch):
    """A stub ``server`` module whose ``PromptServer.instance.routes`` is a real RouteTableDef, as ComfyUI's."""
    instance = types.SimpleNamespace(routes=web.RouteTableDef())
    monkeypatch.setitem(sys.modules, "server", types.SimpleNamespace(PromptServer=types.SimpleNamespace(
        instance=instance)))
    return instance


@pytest.fixture
def comfy_folders(monkeypatch, tiny_models_root):
    """ComfyUI's folder_paths on the tiny models: ``get_full_path`` finds files only, and re-roots a name with
    ``..`` instead of refusing it (as ComfyUI's does)."""
    import os

    loras = tiny_models_root / "loras"

    def get_full_path(kind, name):
        candidate = os.path.join(str(loras), os.path.relpath(os.path.join("/", name), "/"))
        return candidate if os.path.isfile(candidate) else None

    folder_paths = types.SimpleNamespace(get_full_path=get_full_path, get_filename_list=lambda kind: [],
                                         get_folder_paths=lambda kind: [str(tiny_models_root / kind)])
    install_comfyui_modules(monkeypatch, folder_paths)
    yield loras
    comfy_bridge._comfy_modules.cache_clear()


def _serve_like_comfyui(table) -> web.Application:
    """ComfyUI's ``PromptServer.add_routes``: every route as it is and again under ``/api``."""
    app = web.Application()
    for route in table:
        app.router.add_route(route.method, route.path, route.handler)
        app.router.add_route(route.method, "/api" + route.path, route.handler)
    return app


async def _ask(app, *queries):
    async with TestClient(TestServer(app)) as client:
        answers = []
        for query in queries:
            response = await client.get("/api/lorabind/contract", params=query)
            answers.append((response.status, await response.json()))
        return answers


def test_headless_there_is_no_server_to_register_with(monkeypatch):
    monkeypatch.delitem(sys.modules, "server", raising=False)
    assert comfy_bridge.add_server_routes(editor_routes.ROUTES) is False


def test_comfyui_serves_the_same_handler_with_comfyui_folders(comfy_server, comfy_folders):
    assert comfy_bridge.add_server_routes(editor_routes.ROUTES) is True
    assert comfy_bridge.add_server_routes(editor_routes.ROUTES) is True  # a second import adds nothing
    routes = [(r.method, r.path, r.handler) for r in comfy_server.routes]
    assert routes == [("GET", "/lorabind/contract", editor_routes.get_declared_contract)]

    (high, declared), (peft, undeclared), (escaping, refused), (missing, gone) = asyncio.run(_ask(
        _serve_like_comfyui(comfy_server.routes), {"name": WAN22_HIGH}, {"name": PEFT_FOLDER},
        {"name": "../loras/" + WAN22_HIGH}, {"name": "nothing.safetensors"}))
    # the contract inspect reports, for a file ComfyUI's folder_paths found and a PEFT folder the pack found
    assert (high, peft) == (200, 200)
    assert declared["contract"] == inspect_lora(str(comfy_folders / WAN22_HIGH))["contract"]
    assert declared["contract"]["steps"] == 4 and declared["family"] == "wan"
    assert undeclared["contract"] is None
    assert undeclared["reason"] == "its name and metadata declare no sampling contract"
    # ComfyUI would re-root "../loras/…" onto another file: the route refuses it instead
    assert (escaping, missing) == (400, 404)
    assert "'..' would leave" in refused["reason"] and refused["contract"] is None
    assert gone["reason"] == "no LoRA file or PEFT adapter folder named 'nothing.safetensors' in the loras folder"


def test_comfyui_importing_the_pack_by_path_registers_the_route(comfy_server, comfy_folders):
    with _pack_loaded_by_path() as (module, _):
        assert "LoraBindSampler" in module.NODE_CLASS_MAPPINGS
        paths = [(route.method, route.path) for route in comfy_server.routes]
        assert paths == [("GET", "/lorabind/contract")]
        handler = next(iter(comfy_server.routes)).handler
        assert handler.__module__ == f"{module.__name__}.nodes.editor_routes"
