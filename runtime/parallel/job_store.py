"""The authenticated channel of one parallel job: a ``torch.distributed`` TCPStore that listens on loopback (or
on the interface a job across hosts names), through which the ranks meet and rank 0 hands out prompts, and whose
every value is signed with the job's secret.

Why signed: a TCPStore has no authentication of its own. Any process that can reach its port may connect, list
the keys (``list_keys``), read every value and write its own. So every value we store carries an HMAC-SHA256 of
its key and body under a key derived from the job's secret, and a value that is unsigned or signed with another
key is ignored and reported (``ForeignValues``): a process without the secret cannot make a rank run, stop or
skip anything. The keys live under a prefix derived from the secret too, so two jobs sharing a store (torchrun's)
never read each other's keys and a stranger's writes to the plain names (``cmd0``) reach nothing.

What signing does not give: secrecy. The values are not encrypted, and a process that connects can list and read
them; that is why the store listens on loopback by default (no other host can connect) and why the comfy.org
tokens of a prompt never enter it (``parallel_job`` keeps them on rank 0). A local process can also delete keys or
flood the store, which stops the job (a denial of service), and torch's own rendezvous keys of the process group
are not ours to sign. docs/serving/several-gpus.md says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from ...loaders.distributed.process_group import ParallelRunError

log = logging.getLogger("lorabind.parallel")

MEET_POLL_S = 0.05
STORE_TIMEOUT_S = 30.0  # a store operation (no key is waited for: ``peek`` never blocks)
_ABSENT = "\x00lorabind: no value\x00"  # what peek's compare-and-set expects: no signed value can be this


class ForeignValues:
    """Keys whose value was not signed with this job's secret: each reported once (a flood is one line per key,
    not one per poll)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.keys: list[str] = []

    def report(self, key: str) -> None:
        with self._lock:
            if key in self.keys:
                return
            self.keys.append(key)
        log.warning("lorabind: ignored the value of %r in the job's store: it is not signed with this job's "
                    "secret (a process outside the job wrote it)", key)


class JobStore:
    """``store`` (any ``torch.distributed.Store``) seen through the job's secret: values are JSON, signed, under
    the secret's prefix and ``namespace``. ``within`` gives a sub-namespace over the same connection."""

    def __init__(self, store, secret: bytes, namespace: str = "", foreign: ForeignValues | None = None,
                 listener: socket.socket | None = None):
        self.raw, self._secret, self.namespace = store, secret, namespace
        self._listener = listener  # the socket a hosted store serves on: open as long as the store is
        self._mac_key = _derived(secret, b"lorabind job store: signing key")
        self.prefix = f"lorabind-{_derived(secret, b'lorabind job store: key prefix').hex()[:24]}/{namespace}"
        self.foreign = foreign or ForeignValues()

    @classmethod
    def host(cls, secret: bytes, address: str, timeout_s: float, port: int = 0) -> "JobStore":
        """Start the store on ``address`` (port 0: a free one), bound there by us rather than by torch, whose
        TCPStore server listens on every interface."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(128)
            store = dist.TCPStore(address, listener.getsockname()[1], None, True, timedelta(seconds=timeout_s),
                                  wait_for_workers=False, master_listen_fd=listener.fileno())
        except OSError as exc:
            listener.close()
            raise ParallelRunError(f"cannot start the job's store on {address}:{port}: "
                                   f"{exc.strerror or exc}") from None
        return cls(store, secret, listener=listener)

    @classmethod
    def connect(cls, secret: bytes, address: str, port: int, timeout_s: float) -> "JobStore":
        """Reach the store at ``address:port`` within ``timeout_s`` (one line naming them when nobody answers).
        Our own connect loop first: torch's client logs a C++ backtrace per failed try, and retries past its
        timeout."""
        deadline = time.monotonic() + timeout_s
        while not _answers(address, port):
            if time.monotonic() > deadline:
                raise ParallelRunError(f"nobody answers at MASTER_ADDR:MASTER_PORT {address}:{port} within "
                                       f"{timeout_s:g} s (is rank 0, or torchrun, running there?)")
            time.sleep(MEET_POLL_S)
        try:
            store = dist.TCPStore(address, port, None, False, timedelta(seconds=timeout_s))
        except (RuntimeError, OSError, ValueError):  # torch's DistNetworkError/DistStoreError are RuntimeErrors
            raise ParallelRunError(f"nobody answers at MASTER_ADDR:MASTER_PORT {address}:{port} within "
                                   f"{timeout_s:g} s (is rank 0, or torchrun, running there?)") from None
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        return cls(store, secret)

    @property
    def port(self) -> int:
        return self.raw.port

    def within(self, namespace: str) -> "JobStore":
        return JobStore(self.raw, self._secret, f"{self.namespace}{namespace}/", self.foreign, self._listener)

    def connection(self) -> "JobStore":
        """The same store on a connection of its own, for a thread that must not wait behind another's call."""
        clone = getattr(self.raw, "clone", None)
        raw = clone() if isinstance(self.raw, dist.TCPStore) and clone is not None else self.raw
        return JobStore(raw, self._secret, self.namespace, self.foreign, self._listener)

    def group_store(self):
        """What the process group meets through (torch's keys, under this namespace's prefix)."""
        return dist.PrefixStore(f"{self.prefix}group", self.raw)

    # -- signed values -----------------------------------------------------------------------------------------
    def set(self, key: str, value) -> None:
        body = json.dumps(value).encode()
        self.raw.set(self.prefix + key, self._signature(key, body) + b":" + body)

    def peek(self, key: str):
        """The value at ``key``, or None when there is none or it is not signed with the job's secret. Never
        waits: a compare-and-set whose expected value no key holds reads the value in one round trip, or says
        there is none (``get`` would wait for a key deleted since a ``check``)."""
        stored = bytes(self.raw.compare_set(self.prefix + key, _ABSENT, _ABSENT))
        if stored == _ABSENT.encode():
            return None
        signature, _, body = stored.partition(b":")
        if not hmac.compare_digest(signature, self._signature(key, body)):
            self.foreign.report(self.prefix + key)
            return None
        return json.loads(body)

    def delete(self, keys) -> None:
        for key in keys:
            self.raw.delete_key(self.prefix + key)

    def _signature(self, key: str, body: bytes) -> bytes:
        message = (self.prefix + key).encode() + b"\0" + body
        return hmac.new(self._mac_key, message, hashlib.sha256).hexdigest().encode()

    # -- meeting -----------------------------------------------------------------------------------------------
    def meet(self, rank: int, world_size: int, timeout_s: float, alive=None) -> dict[int, dict]:
        """Say this rank has arrived and wait, at most ``timeout_s``, for every rank of the job to say so; returns
        each rank's {"pid", "host"}. A rank started with another secret writes under another prefix, so it shows
        as missing, and the one line says which ranks that is. ``alive()``: why a rank will never come, if known
        (a process that exited), which ends the wait at once."""
        self.set(f"joined/r{rank}", {"pid": os.getpid(), "host": socket.gethostname()})
        deadline = time.monotonic() + timeout_s
        while True:
            arrived = {other: self.peek(f"joined/r{other}") for other in range(world_size)}
            missing = [str(other) for other, seen in arrived.items() if seen is None]
            if not missing:
                return arrived
            gone = alive() if alive is not None else None
            if gone:
                raise ParallelRunError(gone)
            if time.monotonic() > deadline:
                raise ParallelRunError(f"rank(s) {', '.join(missing)} of {world_size} did not join within "
                                       f"{timeout_s:g} s (every rank of a job must run with the same "
                                       "LORABIND_JOB_SECRET)")
            time.sleep(MEET_POLL_S)


def _answers(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _derived(secret: bytes, purpose: bytes) -> bytes:
    """One key per use of the secret (HMAC as a key-derivation function), so the prefix shown in the store
    reveals nothing of the signing key."""
    return hmac.new(secret, purpose, hashlib.sha256).digest()
