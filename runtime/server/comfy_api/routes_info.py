"""Read-only info routes (``/object_info``, ``/system_stats``, ``/extensions``, ``/models``, ...) and the static
folders: frontend extensions at ``/extensions/<name>/`` and example workflows at ``/workflow_templates``."""

from __future__ import annotations

import asyncio
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from aiohttp import web

from ....loaders.placement.devices import host_memory
from ....nodes.editor_routes import ROUTES as EDITOR_ROUTES
from ... import folder_paths
from ...node_info import object_info
from ..composition_root import STATE_KEY, ServerState
from ..config import PACK_NAME
from ..http_json import dumps
from .template_thumbnails import thumbnail_folder


def register(routes: web.RouteTableDef) -> None:
    routes.get("/object_info")(get_object_info)
    routes.get("/object_info/{node_class}")(get_object_info_one)
    routes.get("/system_stats")(get_system_stats)
    routes.get("/embeddings")(get_embeddings)
    routes.get("/extensions")(get_extensions)
    routes.get("/features")(get_features)
    routes.get("/i18n")(get_i18n)
    routes.get("/models")(get_model_folders)
    routes.get("/models/{folder}")(get_model_files)
    routes.get("/experiment/models")(get_model_library_folders)
    routes.get("/experiment/models/{folder}")(get_model_library_files)
    routes.get("/global_subgraphs")(get_global_subgraphs)
    routes.get("/workflow_templates")(get_workflow_templates)
    routes.get("/lorabind/routing")(get_routing)

    for method, path, handler in EDITOR_ROUTES:  # the handlers ComfyUI's server also gets (nodes/editor_routes)
        routes.route(method, path)(handler)


def add_static_routes(app: web.Application, state: ServerState) -> None:
    for name, directory in state.config.web_extensions.items():
        if Path(directory).is_dir():
            app.router.add_static(f"/extensions/{name}", directory, append_version=False)
    templates = Path(state.config.templates_dir)
    if templates.is_dir():
        # before the folder: the thumbnails are rendered into the state folder, not beside the templates
        app.router.add_get(f"/api/workflow_templates/{PACK_NAME}/{{name}}.jpg", get_template_thumbnail)
        app.router.add_static(f"/api/workflow_templates/{PACK_NAME}", templates)


async def get_template_thumbnail(request: web.Request) -> web.StreamResponse:
    return template_thumbnail(request.app[STATE_KEY].config.state_dir, request.match_info["name"])


def template_thumbnail(state_dir: str, name: str) -> web.StreamResponse:
    """A template's card picture (``template_thumbnails``); 404 for one not rendered (the card's placeholder)."""
    path = thumbnail_folder(state_dir) / f"{name}.jpg"
    if "/" in name or name.startswith(".") or not path.is_file():
        raise web.HTTPNotFound(text=f"no thumbnail for template {name!r}")
    return web.FileResponse(path, headers={"Cache-Control": "no-cache"})


async def get_routing(request: web.Request) -> web.Response:
    """Scale-out routing state: what each replica has bound and how many prompts went where."""
    return web.json_response(request.app[STATE_KEY].routing_state())


async def get_object_info(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    info = await asyncio.to_thread(object_info, state.node_classes, state.display_names, state.python_module)
    return web.json_response(info, dumps=dumps)


async def get_object_info_one(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    name = request.match_info["node_class"]
    if name not in state.node_classes:
        return web.json_response({})
    # object_info's rules for one class (a ComfyUI-only node is not offered here either)
    info = await asyncio.to_thread(object_info, {name: state.node_classes[name]}, state.display_names,
                                   state.python_module)
    return web.json_response(info, dumps=dumps)


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def _devices(ram_total: int, ram_free: int) -> list[dict]:
    """CUDA devices when torch is already loaded and sees one (never import torch just for this)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        devices = []
        for index in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(index)
            devices.append({"name": f"cuda:{index} {torch.cuda.get_device_name(index)}", "type": "cuda",
                            "index": index, "vram_total": total, "vram_free": free,
                            "torch_vram_total": torch.cuda.memory_reserved(index),
                            "torch_vram_free": torch.cuda.memory_reserved(index)
                            - torch.cuda.memory_allocated(index)})
        return devices
    return [{"name": "cpu", "type": "cpu", "index": None, "vram_total": ram_total, "vram_free": ram_free,
             "torch_vram_total": ram_total, "torch_vram_free": ram_free}]


async def get_system_stats(request: web.Request) -> web.Response:
    ram_total, ram_free = host_memory()
    version = _package_version("lorabind")
    return web.json_response({
        "system": {"os": os.name, "ram_total": ram_total, "ram_free": ram_free,
                   # Clients read comfyui_version; we answer with ours so they can tell the servers apart.
                   "comfyui_version": f"lorabind-{version}", "lorabind_version": version,
                   "python_version": sys.version, "pytorch_version": _package_version("torch"),
                   "platform": platform.platform(), "embedded_python": False, "argv": sys.argv},
        "devices": _devices(ram_total, ram_free),
    })


async def get_embeddings(request: web.Request) -> web.Response:
    """Always empty: none of our model families uses textual-inversion embeddings."""
    return web.json_response([])


async def get_extensions(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    urls = []
    for name, directory in state.config.web_extensions.items():
        root = Path(directory)
        if root.is_dir():
            urls += [f"/extensions/{name}/{p.relative_to(root).as_posix()}" for p in sorted(root.rglob("*.js"))]
    return web.json_response(urls)


async def get_features(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].feature_flags())


async def get_i18n(request: web.Request) -> web.Response:
    """No translations: our nodes' names and tooltips come in English from /object_info."""
    return web.json_response({})


async def get_model_folders(request: web.Request) -> web.Response:
    return web.json_response(sorted(folder_paths.folder_names_and_paths))


async def get_model_files(request: web.Request) -> web.Response:
    folder = request.match_info["folder"]
    if folder not in folder_paths.folder_names_and_paths:
        raise web.HTTPNotFound(text=f"unknown model folder {folder!r}")
    return web.json_response(await asyncio.to_thread(folder_paths.get_filename_list, folder))


async def get_model_library_folders(request: web.Request) -> web.Response:
    """The frontend's model library: each model kind with its folders (ComfyUI's ``app/model_manager.py``)."""
    return web.json_response([{"name": kind, "folders": folder_paths.get_folder_paths(kind)}
                              for kind in sorted(folder_paths.folder_names_and_paths)])


def _model_library_entries(kind: str) -> list[dict]:
    roots = folder_paths.get_folder_paths(kind)
    entries = []
    for name in folder_paths.get_filename_list(kind):
        for index, root in enumerate(roots):
            path = Path(root, *name.split("/"))
            if path.exists():
                stat = path.stat()
                entries.append({"name": name, "pathIndex": index, "modified": stat.st_mtime,
                                "created": stat.st_ctime, "size": stat.st_size if path.is_file() else 0})
                break
    return entries


async def get_model_library_files(request: web.Request) -> web.Response:
    """The models of one kind with the index of the folder each lies in, as the model library lists them."""
    kind = request.match_info["folder"]
    if kind not in folder_paths.folder_names_and_paths:
        raise web.HTTPNotFound(text=f"unknown model folder {kind!r}")
    return web.json_response(await asyncio.to_thread(_model_library_entries, kind))


async def get_global_subgraphs(request: web.Request) -> web.Response:
    """No subgraph blueprints are shipped (ComfyUI lists those of its packs here)."""
    return web.json_response({})


async def get_workflow_templates(request: web.Request) -> web.Response:
    """No pack templates: the examples (``workflows/``) are the editor's template index
    (``routes_frontend.get_core_templates``), where a card has a title and a description; listed here too, they
    would show twice, by file name. Each stays at ``/api/workflow_templates/lorabind/<name>.json``."""
    return web.json_response({})
