"""``lorabind serve``: a ComfyUI-compatible HTTP/WebSocket API (aiohttp) over the headless executor.

Split by concern: ``app`` (factory, middlewares), ``state`` (config + shared objects), ``queue``/``history``
(priority queue, persisted history), ``worker`` (the one execution thread), ``websocket`` (clients, ``/ws``),
``routes_prompt``/``routes_files``/``routes_info`` (endpoints), ``http_json`` (request/response helpers),
``background`` (the server on its own thread, for tests and embedding).
"""

from .app import create_app, run_server
from .background import BackgroundServer
from .state import ServerConfig

__all__ = ["BackgroundServer", "ServerConfig", "create_app", "run_server"]
