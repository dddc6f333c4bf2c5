"""``lorabind run WF --parallel ...`` outside torchrun: start the job's ranks as child processes and wait for them.

Each child is the same command line run as ``python -m <package>.runtime.cli`` with the environment torchrun would
give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so a rank behaves the same whoever started it.
Only rank 0's stdout is shown. When one rank fails, the others are stopped at once (they would otherwise wait in a
collective until the group's timeout) and the run fails naming the rank.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

STOP_GRACE_S = 10.0  # a stopped rank gets this long to exit before it is killed
POLL_S = 0.1


def free_port() -> int:
    """A TCP port nobody listens on now, for the ranks' rendezvous on this machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_command(argv: list[str]) -> list[str]:
    """The command line of one rank: this interpreter running our CLI module with the same arguments."""
    package = __package__.split(".")[0]
    return [sys.executable, "-m", f"{package}.runtime.cli", *argv]


def rank_environment(rank: int, world_size: int, port: int) -> dict:
    """The parent's environment plus torchrun's variables; the package's folder leads PYTHONPATH so a child finds
    the same ``lorabind`` the parent runs (a source checkout as much as an installed one)."""
    package_root = os.path.dirname(os.path.dirname(sys.modules[__package__.split(".")[0]].__file__))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "PYTHONPATH": path}


def launch_ranks(world_size: int, argv: list[str], command: str = "run") -> int:
    """Run ``argv`` as ``world_size`` ranks; 0 when all succeed, else the first failing rank's exit code.
    ``command`` names the job in what is printed (``lorabind run`` or ``lorabind serve``)."""
    port = free_port()
    _stop_ranks_on_sigterm()
    ranks = [subprocess.Popen(rank_command(argv), env=rank_environment(rank, world_size, port),
                              stdout=None if rank == 0 else subprocess.DEVNULL)
             for rank in range(world_size)]
    try:
        return _wait_for(ranks, command)
    finally:
        _stop(ranks)


def _stop_ranks_on_sigterm() -> None:
    """A service manager stops a server with SIGTERM, whose default action would end this process alone and leave
    its ranks running: raise SystemExit instead, so ``launch_ranks`` stops them on the way out."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def _wait_for(ranks: list, command: str) -> int:
    while True:
        codes = [process.poll() for process in ranks]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            others = [str(r) for r, c in enumerate(codes) if c is None]
            stopped = f"; ranks {', '.join(others)} stopped" if others else ""
            print(f"lorabind {command}: rank {rank} of {len(ranks)} failed (exit code {code}){stopped}", file=sys.stderr)
            return code
        if all(code == 0 for code in codes):
            return 0
        time.sleep(POLL_S)


def _stop(ranks: list) -> None:
    """Stop the ranks still running: terminate, then kill what is left after the grace period."""
    running = [process for process in ranks if process.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
