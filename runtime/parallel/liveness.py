"""Whether every rank of a served job is still there: each rank other than 0 beats a heartbeat into the job's
store, and rank 0 watches the beats (and, when it started them, the processes).

Why heartbeats: a rank that is stopped (SIGSTOP, a debugger, a swapped-out machine) neither answers nor fails;
its peers wait in their next collective until the group's timeout (minutes) and learn nothing of who stopped. A
heartbeat comes from a thread of its own, so it goes on while the rank computes or waits in a collective, and
stops only when the whole process does. Rank 0 then names the rank, stops it when it can (a process it started,
or one on this host), which ends its peers' collectives at once, and the job starts its ranks again or stops.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

from .job_store import JobStore

BEAT_S = 0.5
WATCH_S = 0.25


class Heartbeat:
    """A rank's heartbeat: ``alive/r<rank>`` counts up every ``BEAT_S`` on a connection of its own."""

    def __init__(self, store: JobStore, rank: int):
        self.store, self.rank = store, rank
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lorabind-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _beat(self) -> None:
        beat = 0
        while not self._stopped.is_set():
            beat += 1
            try:
                self.store.set(f"alive/r{self.rank}", beat)
            except RuntimeError:  # the store's host has gone: the job is over, the main thread finds out too
                return
            self._stopped.wait(BEAT_S)


class Liveness:
    """Rank 0's watch over ranks 1..N-1. ``processes``: {rank: Popen} of the ranks this process started (their
    exit is seen at once); ``peers``: {rank: {"pid", "host"}} from the meeting, to stop a stalled rank on this
    host. ``lost()`` is why the group cannot go on (None while it can)."""

    def __init__(self, store: JobStore, world_size: int, timeout_s: float, processes: dict | None = None,
                 peers: dict | None = None):
        self.store, self.world_size, self.timeout_s = store, world_size, timeout_s
        self.processes, self.peers = processes or {}, peers or {}
        self._reason: str | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lorabind-liveness", daemon=True)

    def start(self) -> "Liveness":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def lost(self) -> str | None:
        with self._lock:
            reason = self._reason
        return reason or self._exited()

    def wait_lost(self, seconds: float) -> str | None:
        """``lost()``, waiting up to ``seconds`` for it: a peer's connection closes a moment before its process
        can be seen to have exited."""
        deadline = time.monotonic() + seconds
        while (reason := self.lost()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return reason

    def _exited(self) -> str | None:
        for rank, process in sorted(self.processes.items()):
            code = process.poll()
            if code is not None:
                return self._set(f"rank {rank} of {self.world_size} stopped ({describe_exit(code)})")
        for rank, peer in sorted(self.peers.items()):
            if rank != 0 and rank not in self.processes and _gone(peer):
                return self._set(f"rank {rank} of {self.world_size} stopped (its process on this host exited)")
        return None

    def _set(self, reason: str) -> str:
        with self._lock:
            self._reason = self._reason or reason
            return self._reason

    def _watch(self) -> None:
        beats = {rank: (None, time.monotonic()) for rank in range(1, self.world_size)}
        while not self._stopped.wait(WATCH_S):
            if self.lost() is not None:
                return
            now = time.monotonic()
            for rank, (last, since) in list(beats.items()):
                try:
                    beat = self.store.peek(f"alive/r{rank}")
                except RuntimeError:
                    return
                if beat != last:
                    beats[rank] = (beat, now)
                elif now - since > self.timeout_s:
                    self._set(f"rank {rank} of {self.world_size} stopped responding (no heartbeat for "
                              f"{self.timeout_s:g} s, --rank-timeout) and was stopped")
                    self._stop_rank(rank)
                    return

    def _stop_rank(self, rank: int) -> None:
        """Kill a stalled rank this process can reach: its peers' collectives then fail at once instead of at the
        group's timeout (SIGKILL also ends a SIGSTOPped process)."""
        process = self.processes.get(rank)
        if process is not None:
            process.kill()
            return
        peer = self.peers.get(rank) or {}
        if peer.get("host") == socket.gethostname() and isinstance(peer.get("pid"), int):
            try:
                os.kill(peer["pid"], signal.SIGKILL)
            except OSError:
                pass


def _gone(peer: dict) -> bool:
    """Whether a rank's process on this host (torchrun's, or started by hand) has exited: no such process, or
    one its parent has not reaped yet (a zombie). A rank on another host is known by its heartbeat alone."""
    if peer.get("host") != socket.gethostname() or not isinstance(peer.get("pid"), int):
        return False
    try:
        with open(f"/proc/{peer['pid']}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc here: ask the kernel whether the process exists at all
        try:
            os.kill(peer["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


def describe_exit(code: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` (Popen's negative codes are signals)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
