"""Run the server on its own event-loop thread inside the current process.

Why: tests, the load test and notebooks need a real listening server (real sockets, real middlewares) while
the calling thread stays free to act as a client. ``port=0`` picks a free ephemeral port.
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from .app import create_app
from .config import ServerConfig


class BackgroundServer:
    def __init__(self, config: ServerConfig, **app_kwargs):
        self.config = config
        self.app = create_app(config, **app_kwargs)
        self.port: int = 0
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(self.app, access_log=None)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="lorabind-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.config.listen}:{self.port}"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"server did not start within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"server failed to start: {self._error}") from self._error
        return self

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.config.listen, self.config.port)
            self._loop.run_until_complete(site.start())
            self.port = self._runner.addresses[0][1]
        except BaseException as exc:  # reported to start()'s caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Shut down: close sockets, stop the worker (interrupting a running prompt), join the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
