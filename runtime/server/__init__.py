"""``lorabind serve``: a ComfyUI-compatible HTTP/WebSocket API (aiohttp) over the headless executor, with
OpenAI-style endpoints beside it.

Three folders, so each API reads on its own. This one holds the plumbing both share: ``app`` (factory,
middlewares; the one module that assembles the two APIs), ``config`` (ServerConfig), ``composition_root``
(ServerState: the shared objects every route uses), ``queue``/``history`` (priority queue, persisted history),
``worker`` (the one execution thread), ``websocket`` (clients, ``/ws``), ``http_json`` (request/response
helpers), ``in_process_server`` (the server on its own thread, for tests and embedding). ``comfy_api/`` holds
ComfyUI's routes and their services (``prompt_service``: the validation every queued prompt passes);
``openai/`` the ``/v1`` endpoints, which queue through that same service.
"""

from .app import create_app, run_server
from .config import ServerConfig
from .in_process_server import BackgroundServer

__all__ = ["BackgroundServer", "ServerConfig", "create_app", "run_server"]
