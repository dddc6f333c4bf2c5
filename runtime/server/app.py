"""aiohttp application factory and middlewares for ``lorabind serve``.

Security posture mirrors ComfyUI's so that existing clients behave the same (comfyui.md §4.1): a browser page
on another origin may not drive a loopback server (403) unless ``--enable-cors-header`` is given; bodies over
``--max-upload-size`` get 413; malformed JSON gets 400 (ComfyUI answers 500 there — we do better); every route
exists as ``/path`` and ``/api/path``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import sys
import urllib.parse

from aiohttp import web

from ..listen import bind_listeners, listening_port
from .comfy_api import routes_files, routes_info, routes_jobs, routes_prompt, routes_settings, routes_userdata
from .comfy_api.example_warm_up import warm_up_in_background
from .comfy_api.routes_frontend import INSTALL_HINT, add_frontend_routes, frontend_static_dir
from .comfy_api.routes_logs import add_log_routes
from .composition_root import STATE_KEY, ServerState
from .config import ServerConfig
from .openai import routes as openai_routes

log = logging.getLogger("lorabind.server")


def _is_loopback_literal(host: str) -> bool | None:
    """True/False for IP literals and localhost names; None when the name needs resolving."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return None


async def _is_loopback(host: str | None) -> bool:
    """Does every address of ``host`` resolve to loopback? (ComfyUI resolves names the same way.)"""
    if not host:
        return False
    literal = _is_loopback_literal(host)
    if literal is not None:
        return literal
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def _split_host(netloc: str) -> tuple[str, int | None]:
    parts = urllib.parse.urlsplit("//" + netloc.lower())
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.hostname or "", port


def origin_only_middleware():
    """403 for a browser request whose Origin differs from a loopback Host (cross-site POSTs to 127.0.0.1).

    As in ComfyUI, the ports are ignored only when the Host header has none (browsers that omit it); a page
    served from another port of the same machine is another origin.
    """

    @web.middleware
    async def middleware(request: web.Request, handler):
        host_header, origin_header = request.headers.get("Host"), request.headers.get("Origin")
        if host_header and origin_header:
            host, host_port = _split_host(host_header)
            origin, origin_port = _split_host(urllib.parse.urlsplit(origin_header).netloc)
            same = host == origin and (host_port is None or host_port == origin_port)
            if not same and await _is_loopback(host):
                log.warning("refused cross-origin request from %s to %s %s", origin_header, request.method,
                            request.path)
                return web.json_response(
                    {"error": {"type": "forbidden_origin",
                               "message": f"Cross-origin request from {origin_header!r} refused; start the "
                                          "server with --enable-cors-header to allow it.",
                               "details": "", "extra_info": {}}}, status=403)
        return await handler(request)

    return middleware


def host_check_middleware(config: ServerConfig):
    """403 for a request whose Host header is not a loopback name, when the server listens on loopback only.

    DNS rebinding: a page on evil.com re-points its name at 127.0.0.1; the browser then sends same-origin requests
    (``Host: evil.com``, ``Origin: http://evil.com``) that the origin check cannot tell apart from our own page.
    A loopback-bound server has no business answering to other names, so only ``localhost``, ``*.localhost``
    and loopback IP literals are accepted (or no Host at all: browsers always send one), plus whatever ``--allowed-hosts`` names (``*``: any). ComfyUI does
    not check this (it passes the request above). Not applied when listening on other addresses, where
    clients reach us under names we cannot know.
    """
    allowed = {h.lower() for h in config.allowed_hosts}

    @web.middleware
    async def middleware(request: web.Request, handler):
        host, _ = _split_host(request.headers.get("Host", ""))
        if host and "*" not in allowed and host not in allowed and not _is_loopback_literal(host):
            log.warning("refused request for Host %r (not a loopback name; see --allowed-hosts)", host)
            return web.json_response(
                {"error": {"type": "forbidden_host",
                           "message": f"Host {host!r} is not a loopback name; start the server with "
                                      f"--allowed-hosts {host or 'NAME'} to allow it.",
                           "details": "", "extra_info": {}}}, status=403)
        return await handler(request)

    return middleware


def _listens_on_loopback_only(config: ServerConfig) -> bool:
    hosts = [h.strip() for h in config.listen.split(",") if h.strip()]
    return bool(hosts) and all(_is_loopback_literal(h) for h in hosts)


def cors_middleware(allowed_origin: str):
    """ComfyUI's CORS headers, also on error answers (400/404/413 are raised as HTTPException): without them a
    page on the allowed origin could not read why its request was refused. (ComfyUI omits them there.)"""
    headers = {"Access-Control-Allow-Origin": allowed_origin,
               "Access-Control-Allow-Methods": "POST, GET, DELETE, PUT, OPTIONS",
               "Access-Control-Allow-Headers": "Content-Type, Authorization",
               "Access-Control-Allow-Credentials": "true"}

    @web.middleware
    async def middleware(request: web.Request, handler):
        try:
            response = web.Response() if request.method == "OPTIONS" else await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(headers)
            raise
        response.headers.update(headers)
        return response

    return middleware


@web.middleware
async def json_errors_middleware(request: web.Request, handler):
    """Unexpected exceptions become a logged 500 with a JSON body instead of aiohttp's bare text page. The body
    never carries a local absolute path (the log has the full traceback): an OSError shows its reason without
    the file name, and the server's folders are named by their role."""
    try:
        return await handler(request)
    except (web.HTTPException, ConnectionError):
        raise
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        message = without_local_folders(f"{type(exc).__name__}: {reason}", request.app[STATE_KEY].config)
        return web.json_response({"error": {"type": "server_error", "message": message,
                                            "details": request.path, "extra_info": {}}}, status=500)


def without_local_folders(text: str, config: ServerConfig) -> str:
    """``text`` with each of the server's absolute folders replaced by its role (``<state folder>``, ...)."""
    folders = {"state folder": config.state_dir, "models folder": config.models_root, "output folder":
               config.output_dir, "input folder": config.input_dir, "temp folder": config.temp_dir}
    for role, folder in sorted(folders.items(), key=lambda item: -len(item[1] or "")):
        if folder:
            text = text.replace(folder, f"<{role}>")
    return text


def create_app(config: ServerConfig, *, node_classes: dict | None = None, display_names: dict | None = None,
               executor=None, validator=None, unload_models=None) -> web.Application:
    """Build the app. ``node_classes`` (and their ``display_names``) default to the pack's nodes;
    ``executor``/``validator`` default to ``PromptExecutor`` instances: a persistent one for the worker and a
    cache-less one for request validation, so validating never touches the state of a running prompt.
    ``unload_models``: what ``/free`` calls to unload the models (default: this process's model store)."""
    middlewares = [cors_middleware(config.cors_origin) if config.cors_origin else origin_only_middleware(),
                   json_errors_middleware]
    if _listens_on_loopback_only(config):
        middlewares.insert(0, host_check_middleware(config))
    app = web.Application(client_max_size=config.max_upload_bytes, middlewares=middlewares)
    state = ServerState(config, node_classes=node_classes, display_names=display_names, executor=executor,
                        validator=validator, unload_models=unload_models)
    app[STATE_KEY] = state

    routes = web.RouteTableDef()
    routes_prompt.register(routes)
    routes_files.register(routes)
    routes_info.register(routes)
    routes_userdata.register(routes)
    routes_settings.register(routes)
    routes_jobs.register(routes)
    routes.get("/ws")(state.clients.handle)
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
        app.router.add_route(route.method, "/api" + route.path, route.handler)
    routes_info.add_static_routes(app, state)
    openai_routes.register(app, state)  # /v1/…: OpenAI-style endpoints over --openai-model templates
    add_log_routes(app, state)  # /internal/logs/…: the editor's Logs panel
    add_frontend_routes(app)  # last: it mounts the frontend's folder at /

    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_on_shutdown)
    return app


async def _on_startup(app: web.Application) -> None:
    state: ServerState = app[STATE_KEY]
    state.clients.bind_loop(asyncio.get_running_loop())
    if state.models_built.is_set():  # else the examples' warm-up starts it when done (example_warm_up)
        state.worker.start()


async def _on_shutdown(app: web.Application) -> None:
    state: ServerState = app[STATE_KEY]
    prompt_id, node_id = state.worker.running()
    if prompt_id is None:
        log.info("shutting down (no prompt running)")
    else:  # Ctrl-C: say what the wait is for; the node stops at its next interrupt check (a step, a layer)
        log.info("shutting down: interrupting the running prompt %s%s", prompt_id,
                 f" at node {node_id}" if node_id else "")
    await state.clients.close_all()
    await asyncio.to_thread(state.shutdown)


def run_server(config: ServerConfig, *, render_thumbnails: bool = True, listeners: list | None = None,
               on_stopped=None, **app_kwargs) -> None:
    """Serve until Ctrl-C (used by ``lorabind serve``); ``app_kwargs`` go to ``create_app`` (``serve --parallel``
    brings its executor, the sockets it bound before starting its ranks, and ``on_stopped``: what stops the ranks
    once the server has, returning the exit code)."""
    hosts = [h.strip() for h in config.listen.split(",") if h.strip()]
    if listeners is None:
        listeners = bind_listeners(hosts, config.port)  # first: a taken port is one line, before any banner
    for host in hosts:
        shown = f"[{host}]" if ":" in host else host
        print(f"lorabind serve: http://{shown}:{listening_port(listeners)}")
    print(f"  models: {config.models_root}\n  output: {config.output_dir}\n  input:  {config.input_dir}")
    app = create_app(config, **app_kwargs)
    warm_up_in_background(app, config, render_thumbnails)  # after it listens: the log says "ready" when done

    for line in openai_routes.startup_lines(app):
        print(line)

    print("  editor: the ComfyUI frontend at /" if frontend_static_dir() is not None
          else f"  editor: not installed ({INSTALL_HINT})")
    print("  examples: prepared in the background; prompts queued meanwhile run after the log says \"ready\"",
          flush=True)
    _log_to_stderr()
    # shutdown_timeout: on Ctrl-C wait at most this long for open HTTP requests (aiohttp's default is 60 s)
    web.run_app(app, sock=listeners, print=None, access_log=None, shutdown_timeout=_SHUTDOWN_S)
    code = on_stopped() if on_stopped is not None else 0
    print("lorabind serve: stopped", file=sys.stderr, flush=True)
    # Skip the interpreter's teardown: with torch, diffusers and a model loaded it takes seconds (longer than the
    # shutdown itself) and only frees memory; history and outputs are already on disk, written atomically.
    sys.stdout.flush()
    os._exit(code)


_SHUTDOWN_S = 2.0


def _log_to_stderr() -> None:
    """The server's per-prompt lines (queued / started / finished / failed) on stderr, with the time."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

