"""The official ComfyUI frontend at ``/``, from the ``comfyui-frontend-package`` wheel (``pip install "lorabind[ui]"``).

Why the wheel and not our own page: it is the editor our users already know, and the API it speaks is the one
this server implements (``routes_userdata``, ``routes_jobs``, ``routes_prompt``, ...). The extra is pinned to
``FRONTEND_VERSION`` because each frontend release calls a slightly different set of endpoints; another
installed version is still served, with a warning. Without the extra, ``GET /`` says how to install it, so a
person opening the address in a browser learns what is missing instead of seeing a 404.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata
from pathlib import Path

from aiohttp import web

from ..composition_root import STATE_KEY
from ..example_assets import served_template_names, template_cards
from .routes_info import template_thumbnail

THUMBNAIL_SUFFIX = "-1.jpg"  # the frontend's picture of an index template: /templates/<name>-1.<mediaSubtype>

log = logging.getLogger("lorabind.server")

FRONTEND_DISTRIBUTION = "comfyui-frontend-package"
FRONTEND_VERSION = "1.58.1"  # the version pyproject's `ui` extra pins and whose calls the routes answer
INSTALL_HINT = 'pip install "lorabind[ui]"'
# The editor's page may load and ask nothing but this server (issue 54): frontend 1.58.1 asks the Comfy registry
# (https://api.comfy.org/nodes?node_id=...) which pack each node of the workflow comes from when the Issues panel
# opens, and no setting of that release turns the lookup off. The policy keeps what the page itself needs (its
# inline styles and scripts, data: and blob: URLs, the WebSocket to this server, which 'self' covers) and makes
# the browser refuse every other host before a request is sent.
CONTENT_SECURITY_POLICY = "default-src 'self' 'unsafe-inline' 'unsafe-eval' data: blob:"


def frontend_static_dir() -> Path | None:
    """The wheel's ``static`` folder (index.html and its assets), or None when the extra is not installed."""
    try:
        import comfyui_frontend_package
    except ImportError:
        return None
    static = Path(comfyui_frontend_package.__file__).resolve().parent / "static"
    return static if (static / "index.html").is_file() else None


def add_frontend_routes(app: web.Application) -> Path | None:
    """``GET /`` (the frontend's index.html or the install hint) and, with the extra, its files under ``/``.

    Call after every API route: the static folder is mounted at ``/``, and aiohttp tries resources in the order
    they were added, so ``/api/...``, ``/view``, ``/extensions/<name>/`` and the rest keep answering first.
    """
    static = frontend_static_dir()
    app.router.add_get("/templates/{name}", get_core_templates)  # the examples' index: for any client
    if static is None:
        app.router.add_get("/", _install_hint)
        return None
    installed = _installed_version()
    if installed != FRONTEND_VERSION:
        log.warning("%s %s is installed; lorabind implements the API of %s (%s)", FRONTEND_DISTRIBUTION,
                    installed or "(unknown version)", FRONTEND_VERSION, INSTALL_HINT)
    index = static / "index.html"

    async def get_index(request: web.Request) -> web.FileResponse:
        # no-cache: after an upgrade of the extra the browser must fetch the new index (its asset names change)
        return web.FileResponse(index, headers={"Cache-Control": "no-cache",
                                                "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    app.router.add_get("/", get_index)
    app.router.add_static("/", static, append_version=False)
    return static


async def get_core_templates(request: web.Request) -> web.StreamResponse:
    """The template index the frontend asks for (``index.json``, ``index.<locale>.json``, ``index_logo.json``), a
    template (``<name>.json``) and its card's picture (``<name>-1.jpg``).

    Why our examples are served as the index and not as a pack's ``/workflow_templates``: frontend 1.58 shows a
    pack's templates by file name alone (title and description both), while an index entry has a title and a
    description (issue 54: the cards showed only the file stem). ComfyUI's own index comes from another wheel
    with workflows for models lorabind does not run; ours holds one category, the examples (``template_cards``:
    each template's first note), main example first. No entry names sample inputs (``io``), so the frontend
    fetches none from outside."""
    name = request.match_info["name"]
    config = request.app[STATE_KEY].config
    if name == "index_logo.json":
        return web.json_response({})
    if name.startswith("index") and name.endswith(".json"):
        cards = await asyncio.to_thread(template_cards, config.templates_dir)
        # category: the dialog's navigation lists a category group ("lorabind") with this entry ("Examples")
        return web.json_response([{"moduleName": "default", "category": "lorabind", "title": "Examples",
                                   "type": "video", "templates": [{**card, "mediaType": "image", "mediaSubtype": "jpg"}
                                                                  for card in cards]}] if cards else [])
    served = await asyncio.to_thread(served_template_names, config.templates_dir)
    if name.endswith(THUMBNAIL_SUFFIX) and name[: -len(THUMBNAIL_SUFFIX)] in served:
        return template_thumbnail(config.state_dir, name[: -len(THUMBNAIL_SUFFIX)])
    if name.endswith(".json") and name[: -len(".json")] in served:
        return web.FileResponse(Path(config.templates_dir) / name, headers={"Cache-Control": "no-cache"})
    raise web.HTTPNotFound()


async def _install_hint(request: web.Request) -> web.Response:
    return web.Response(text=(
        "lorabind serve: ComfyUI-compatible HTTP/WebSocket API (POST /prompt, /ws, /object_info, /history, /view).\n"
        f"The workflow editor is not installed. Install it with\n    {INSTALL_HINT}\n"
        "then restart `lorabind serve` and reload this page. Any ComfyUI client or frontend can also use this "
        "address.\n"))


def _installed_version() -> str:
    try:
        return metadata.version(FRONTEND_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return ""
