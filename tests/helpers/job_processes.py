"""The processes of a ``--parallel`` job and the sockets they listen on, read from /proc (what ``ss -ltnp`` reads):
a process's children, its environment, and every LISTEN socket of a set of processes with its local address."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def environment_of(pid: int) -> dict:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hex_address, 16)))
    words = struct.unpack("<4I", raw)
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


def listening_sockets(pids) -> list[tuple[str, int, int]]:
    """(local address, port, pid) of every TCP socket in LISTEN state that one of ``pids`` holds."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    sockets = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                address, port = fields[1].rsplit(":", 1)
                if fields[3] == LISTEN and fields[9] in owner:
                    sockets.append((_address(address), int(port, 16), owner[fields[9]]))
    return sockets


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending.extend(children(current))
    return tree


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"
