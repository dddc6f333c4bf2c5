"""Starting the ranks of a ``--parallel`` job on this machine: ``lorabind run WF --parallel ...`` outside torchrun
(``launch_ranks``), and the ranks 1..N-1 that rank 0 of ``serve --parallel`` supervises (``start_rank``).

Each rank is the same command line run as ``python -m <package>.runtime.cli`` with the environment torchrun would
give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so a rank behaves the same whoever started it,
plus what torchrun does not give: the job's secret (in the environment, never on a command line), and where the
job's store is, which the starting process hosts on loopback before any rank starts (``job_store.py``). Each rank
runs with its share of the cores (OMP threads = cores / ranks: N ranks of all cores each would fight over them)
and in a session of its own, so a Ctrl-C in the terminal reaches the starting process alone, which hands it to the
ranks (the job's protocol stops the prompt on every rank where rank 0 stopped it: ``run_ranks``). Only rank 0's
stdout is shown. When one rank fails, rank 0 reports it (naming the rank and node) and the run fails; a rank 0
blocked in a collective its failed peer never joins is stopped after a short grace rather than at the group's
timeout.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

from .job_environment import LAUNCHER, SECRET_VARIABLE, STORE_VARIABLE, listen_interface, usable_cores
from .job_store import STORE_TIMEOUT_S, JobStore
from .liveness import describe_exit

STOP_GRACE_S = 10.0  # a stopped rank gets this long to exit before it is killed
FAILURE_GRACE_S = 5.0  # after a rank failed: rank 0 meets the failure at its next node (or is blocked for good)
POLL_S = 0.1
ORPHAN_POLL_S = 1.0


class LaunchStopped(Exception):
    """SIGINT or SIGTERM reached the starting process: its ranks are stopped, quietly. ``exit_code``: 128 plus
    the signal's number, as a shell reports a process that signal ended."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def free_port() -> int:
    """A TCP port nobody listens on now (tests start ranks by hand on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def new_secret() -> str:
    return secrets.token_hex(32)


def rank_command(argv: list[str]) -> list[str]:
    """The command line of one rank: this interpreter running our CLI module with the same arguments."""
    package = __package__.split(".")[0]
    return [sys.executable, "-m", f"{package}.runtime.cli", *argv]


def rank_environment(rank: int, world_size: int, address: str, port: int, secret: str) -> dict:
    """The parent's environment plus torchrun's variables, the job's secret and store, and the rank's threads;
    the package's folder leads PYTHONPATH so a child finds the same ``lorabind`` the parent runs."""
    package_root = os.path.dirname(os.path.dirname(sys.modules[__package__.split(".")[0]].__file__))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    threads = str(max(1, usable_cores() // world_size))
    return {"OMP_NUM_THREADS": threads, **os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": address,
            "MASTER_PORT": str(port), SECRET_VARIABLE: secret, STORE_VARIABLE: LAUNCHER, "PYTHONPATH": path}


def start_rank(rank: int, world_size: int, argv: list[str], store: JobStore, secret: str, address: str,
               extra_env: dict | None = None) -> subprocess.Popen:
    """One rank as a child process in a session of its own (only rank 0's stdout is shown)."""
    environment = {**rank_environment(rank, world_size, address, store.port, secret), **(extra_env or {})}
    return subprocess.Popen(rank_command(argv), env=environment, start_new_session=True,
                            stdout=None if rank == 0 else subprocess.DEVNULL)


def launch_ranks(world_size: int, argv: list[str], command: str = "run", interface: str | None = None) -> int:
    """Run ``argv`` as ``world_size`` ranks; 0 when all succeed, else the first failing rank's exit code (130 or
    143 when stopped by SIGINT or SIGTERM). ``command`` names the job in what is printed."""
    _, address = listen_interface(interface)
    secret = new_secret()
    store = JobStore.host(secret.encode(), address, STORE_TIMEOUT_S)
    ranks: list = []
    try:
        with stopped_by_signals():
            ranks.extend(start_rank(rank, world_size, argv, store, secret, address) for rank in range(world_size))
            return _wait_for(ranks, command)
    except LaunchStopped as stopped:
        if stopped.exit_code == 128 + signal.SIGINT:  # every rank stops where rank 0 did (run_ranks)
            _forward_interrupt(ranks)
        return stopped.exit_code
    finally:
        stop_processes(ranks)


def _forward_interrupt(ranks: list) -> None:
    """Ctrl-C: each rank gets the SIGINT (rank 0 stops its prompt at the next forward, the others where it did;
    a rank still meeting or loading ends at once), and gets ``STOP_GRACE_S`` to end before it is terminated."""
    try:
        with stopped_by_signals():  # a second Ctrl-C: they are terminated at once
            for process in ranks:
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)
            deadline = time.monotonic() + STOP_GRACE_S
            while any(process.poll() is None for process in ranks) and time.monotonic() < deadline:
                time.sleep(POLL_S)
    except LaunchStopped:
        pass


class stopped_by_signals:
    """For the body, SIGINT and SIGTERM raise ``LaunchStopped`` (no traceback; the caller stops its ranks); the
    previous handlers come back afterwards. A no-op off the main thread, where Python cannot set handlers."""

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, _raise_stopped)
        return self

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        return False


def _raise_stopped(signum, _frame):
    raise LaunchStopped(signum)


def _wait_for(ranks: list, command: str) -> int:
    """0 when every rank ends with 0. When one fails, rank 0 gets ``FAILURE_GRACE_S`` to end too: on the job's
    protocol it has then said what failed, naming the rank and node, and its exit code is the job's; a rank 0
    that does not end (blocked in a collective its failed peer never joins) is stopped, and this names the rank."""
    failed_at = None
    while True:
        codes = [process.poll() for process in ranks]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if codes[0] not in (None, 0):
            return codes[0]
        if failed and codes[0] is None:
            failed_at = failed_at or time.monotonic()
        if failed and (codes[0] == 0 or time.monotonic() - failed_at > FAILURE_GRACE_S):
            rank, code = failed[0]
            others = [str(r) for r, c in enumerate(codes) if c is None]
            stopped = f"; ranks {', '.join(others)} stopped" if others else ""
            print(f"lorabind {command}: rank {rank} of {len(ranks)} failed ({describe_exit(code)}){stopped}",
                  file=sys.stderr)
            return code
        if all(code == 0 for code in codes):
            return 0
        time.sleep(POLL_S)


def stop_processes(processes: list, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the processes still running: terminate, then kill what is left after the grace period."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def exit_with_parent() -> None:
    """In a rank our launcher started (a session of its own, so no terminal signal reaches it): end this
    process when the launcher is gone, rather than run on as an orphan."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="lorabind-orphan-watch", daemon=True).start()
