"""The listening sockets of ``lorabind serve``, bound before anything else happens.

Why bind first: the banner, the example models and the thumbnails take minutes on a first start; a port that is
already taken (a second ``serve``) must be said at once, in one line naming the port and the way out, instead of
after a "ready" banner and a traceback from inside aiohttp.
"""

from __future__ import annotations

import socket


class PortUnavailable(ValueError):
    """A listen address cannot be bound; the text names the address, the port and ``--port``."""


def bind_listeners(hosts: list[str], port: int) -> list[socket.socket]:
    """One listening socket per address each of ``hosts`` resolves to (IPv6 ones IPv6-only, so ``0.0.0.0`` and
    ``::`` share a port as aiohttp binds them); ``PortUnavailable`` when one cannot be bound (the others are
    closed)."""
    bound: list[socket.socket] = []
    try:
        for host in hosts:
            for kind, _, _, _, address in _addresses(host, port):
                listener = socket.socket(kind, socket.SOCK_STREAM)
                bound.append(listener)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # rebinding after a restart
                if kind == socket.AF_INET6:
                    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                listener.bind(address)
                listener.listen(128)
                port = port or listener.getsockname()[1]  # --port 0: every address on the port the first got
    except OSError as exc:
        for listener in bound:
            listener.close()
        shown = f"[{host}]" if ":" in host else host
        raise PortUnavailable(f"cannot listen on {shown}:{port}: {exc.strerror or exc} (is another server "
                              f"running there?); choose another port with --port") from None
    return bound


def _addresses(host: str, port: int) -> list:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(exc.errno, f"the address does not resolve ({exc.strerror})") from None


def listening_port(listeners: list[socket.socket]) -> int:
    """The port the sockets listen on (what ``--port 0`` was given)."""
    return listeners[0].getsockname()[1]
