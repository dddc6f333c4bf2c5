"""The control channel of a ``serve --parallel`` job: rank 0 hands each prompt (and each ``/free``) to the other
ranks, and every rank runs the prompt in lockstep with the others.

Why a key-value store and not collectives on the job's group: the group carries the model's own collectives
(all-to-all, all-reduce) inside each step; a control message sent on it while a rank waits in a step's collective
would pair with the wrong call. The store (``JobStore``: torch.distributed's ``TCPStore`` on loopback, every value
signed with the job's secret) is a connection of its own, whose every wait is bounded and polled here, so a rank
that failed is noticed at once rather than after a collective's timeout. Messages are JSON, never pickle: a
prompt comes from an HTTP client.

Lockstep: every rank stops at the same points of a prompt (the executor's ``before_node`` hook), says it arrived,
and rank 0 answers go, stop (an interrupt) or fail (a rank reported an error, or the ranks reached different
points). Only then does any rank go on, so no rank enters a collective its peers will never join: an interrupt or
a failure stops every rank at the same point, and the group stays usable for the next prompt. Inside a sampler
the ranks move together by the step engine's plans (``plan_stream``: rank 0 decides every forward, and where a
request stops), so an interrupt during sampling stops every rank at the same forward. A rank that fails inside a collective (not at a node's start), dies or stalls is found by rank
0's ``liveness.Liveness``, whose verdict ends every wait here at once.
"""

from __future__ import annotations

import threading
import time

from ...loaders.errors import LoraBindError
from ..executor.execution import RunSync
from .job_store import JobStore

POLL_S = 0.002  # while a prompt runs: a store round trip is ~0.1 ms, a step far longer
IDLE_POLL_S = 0.05  # a rank waiting for the next prompt


class RankFailed(LoraBindError):
    """Another rank failed (or the ranks lost step): this rank stops the prompt too. The text names the rank;
    ``node_id``/``node_type`` are the node it failed at (None when it failed outside one)."""

    def __init__(self, failure: dict):
        super().__init__(failure["why"])
        self.node_id, self.node_type = failure.get("node_id"), failure.get("node_type")


class PromptChannel:
    """The job's store (``JobStore``: signed values under the job's prefix) as every rank sees it, and the
    numbering of the commands rank 0 sends. ``lost()`` says why a peer is gone (rank 0's ``Liveness``): every
    wait ends at once then, naming the rank, instead of at the timeout."""

    def __init__(self, store: JobStore, rank: int, world_size: int, timeout_s: float, lost=None):
        self.store, self.rank, self.world_size, self.timeout_s = store, rank, world_size, timeout_s
        self.lost = lost or (lambda: None)
        self._next = 0
        self._sending = threading.Lock()

    # -- commands (rank 0 sends, the others receive in the same order) ----------------------------------------
    def send(self, command: dict) -> int:
        """Rank 0 (from any of its worker threads): the command's number, in the order the others receive them."""
        with self._sending:
            number = self._next
            self._next += 1
            self.store.set(f"cmd{number}", command)
        return number

    def receive(self) -> tuple[int, dict] | None:
        """The next command, waiting as long as the server idles; None once rank 0 has gone (its store with it)
        or said stop."""
        number = self._next
        try:
            while (command := self.store.peek(f"cmd{number}")) is None:
                time.sleep(IDLE_POLL_S)
        except RuntimeError:  # the store's host (rank 0) stopped: the job is over (torch's DistError is one)
            return None
        self._next += 1
        return None if command.get("kind") == "stop" else (number, command)

    def read(self, key: str):
        return self.store.peek(key)

    def write(self, key: str, value) -> None:
        self.store.set(key, value)

    def has(self, key: str) -> bool:
        return self.store.peek(key) is not None

    def forget(self, keys: list[str]) -> None:
        self.store.delete(keys)


class Lockstep(RunSync):
    """One prompt on one rank: the executor's ``RunSync``, which waits for the other ranks before each node.
    ``interrupt`` is the flag the rank's executor reads. On rank 0 it is ``requested`` itself (set by
    ``/interrupt`` at any moment): rank 0 leads, so its sampler stops at its next forward and its engine tells
    the others where, and at a node's start it decides "stop" for everyone. On the other ranks it is ``agreed``,
    set only where rank 0 said so (a node's start, a forward, or after rank 0's prompt ended interrupted)."""

    def __init__(self, channel: PromptChannel, number: int, requested: threading.Event | None = None):
        self.channel, self.prefix = channel, f"p{number}"
        self.requested = requested or threading.Event()
        self.agreed = threading.Event()
        self.points = 0
        self.stopped_by_peer = False

    @property
    def interrupt(self) -> threading.Event:
        return self.requested if self.channel.rank == 0 else self.agreed

    def before_node(self, node_id: str) -> None:
        self.checkpoint(f"start of node {node_id}")

    def node_failed(self, node_id: str, node_type: str, message: str) -> None:
        self.report_failure(node_id, node_type, message)

    def checkpoint(self, label: str) -> None:
        key = f"{self.prefix}/at{self.points}"
        self.points += 1
        self.channel.write(f"{key}/r{self.channel.rank}", label)
        decision = self._decide(key, label) if self.channel.rank == 0 else self._await_decision(key, label)
        if decision["do"] == "stop":
            self.agreed.set()
        elif decision["do"] == "fail":
            self.stopped_by_peer = True
            raise RankFailed(decision)

    def report_failure(self, node_id, node_type, message: str) -> None:
        """This rank's own failure (not one it stopped for): the others stop at their next sync point."""
        if self.stopped_by_peer or self.channel.has(f"{self.prefix}/failed"):
            return
        channel = self.channel
        where = f" at node {node_id} ({node_type})" if node_id is not None else ""
        channel.write(f"{self.prefix}/failed", {
            "do": "fail", "node_id": node_id, "node_type": node_type,
            "why": f"rank {channel.rank} of {channel.world_size} failed{where}: {str(message).strip()}"})

    def finish(self, outcome: dict) -> None:
        if self.channel.rank == 0 and outcome.get("interrupted"):  # a rank still at a node's start stops there
            self.channel.write(f"{self.prefix}/stopped", {"do": "stop"})
        self.channel.write(f"{self.prefix}/done/r{self.channel.rank}", outcome)

    # -- rank 0 ------------------------------------------------------------------------------------------------
    def _decide(self, key: str, label: str) -> dict:
        channel, others = self.channel, range(1, self.channel.world_size)
        deadline = time.monotonic() + channel.timeout_s
        while True:
            decision = channel.read(f"{self.prefix}/failed") or _lost_decision(channel)
            if decision is not None:
                break
            labels = {r: channel.read(f"{key}/r{r}") for r in others}
            if all(other is not None for other in labels.values()):
                apart = {r: other for r, other in labels.items() if other != label}
                if apart:
                    shown = ", ".join(f"rank {r} at the {other}" for r, other in apart.items())
                    decision = {"do": "fail", "why": f"the ranks lost step: rank 0 at the {label}, {shown}"}
                else:
                    decision = {"do": "stop" if self.requested.is_set() else "go"}
                break
            if time.monotonic() > deadline:
                late = ", ".join(str(r) for r, other in labels.items() if other is None)
                decision = {"do": "fail", "why": f"rank(s) {late} of {channel.world_size} did not reach the "
                                                 f"{label} within {channel.timeout_s:g} s"}
                break
            time.sleep(POLL_S)
        channel.write(f"{key}/go", decision)
        return decision

    def outcomes(self) -> dict[int, dict]:
        """Every other rank's outcome of this prompt (``finish``), waiting for them within the timeout, or until
        a rank is found lost."""
        channel, outcomes = self.channel, {}
        deadline = time.monotonic() + channel.timeout_s
        for rank in range(1, channel.world_size):
            key = f"{self.prefix}/done/r{rank}"
            while (outcome := channel.read(key)) is None and time.monotonic() < deadline and not channel.lost():
                time.sleep(POLL_S)
            why = channel.lost() or f"rank {rank} of {channel.world_size} did not finish within {channel.timeout_s:g} s"
            outcomes[rank] = outcome or {"success": False, "interrupted": False, "error": why}
        return outcomes

    def forget(self, command_number: int) -> None:
        """Rank 0, once every rank is done: drop the prompt's keys (the store lives as long as the server)."""
        world = range(self.channel.world_size)
        keys = [f"cmd{command_number}", f"{self.prefix}/failed", f"{self.prefix}/stopped",
                *(f"{self.prefix}/done/r{r}" for r in world)]
        for point in range(self.points):
            keys += [f"{self.prefix}/at{point}/go", *(f"{self.prefix}/at{point}/r{r}" for r in world)]
        self.channel.forget(keys)

    # -- the other ranks ---------------------------------------------------------------------------------------
    def _await_decision(self, key: str, label: str) -> dict:
        channel = self.channel
        deadline = time.monotonic() + channel.timeout_s
        try:
            while (decision := channel.read(f"{key}/go")) is None:
                ended = channel.read(f"{self.prefix}/failed") or channel.read(f"{self.prefix}/stopped")
                if ended is not None:
                    return ended
                if time.monotonic() > deadline:
                    return {"do": "fail", "why": f"rank 0 did not decide past the {label} within "
                                                 f"{channel.timeout_s:g} s"}
                time.sleep(POLL_S)
        except RuntimeError:  # the store closed: rank 0 has gone
            return {"do": "fail", "why": "rank 0 stopped (the job's store closed)"}
        return decision


def _lost_decision(channel: PromptChannel) -> dict | None:
    reason = channel.lost()
    return None if reason is None else {"do": "fail", "why": reason}
