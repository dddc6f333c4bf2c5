"""``lorabind serve``: a ComfyUI-compatible HTTP/WebSocket API (aiohttp) over the headless executor.

Split by concern: ``app`` (factory, middlewares), ``config`` (ServerConfig), ``composition_root`` (ServerState:
the shared objects every route uses), ``queue``/``history``
(priority queue, persisted history), ``worker`` (the one execution thread), ``websocket`` (clients, ``/ws``),
``routes_prompt``/``routes_files``/``routes_info`` (endpoints), ``http_json`` (request/response helpers),
``in_process_server`` (the server on its own thread, for tests and embedding).
"""

from .app import create_app, run_server
from .config import ServerConfig
from .in_process_server import BackgroundServer

__all__ = ["BackgroundServer", "ServerConfig", "create_app", "run_server"]
