"""``lorabind run --parallel``'s prompt on the job's one rank protocol, the one ``serve --parallel`` and a Ray
group of ranks use: nodes met in lockstep (``Lockstep``, the executor's ``before_node`` hook), every denoising
forward as rank 0's step engine plans it (``plan_stream``), and an interrupt or a failure meaning the same on every
rank.

What that gives a run: Ctrl-C stops the prompt on rank 0 at its next forward and every other rank where it did,
so each rank ends with 130 and nothing says "failed"; a node that fails on one rank fails the prompt on every
rank at their next node, and rank 0 reports it naming the rank and node (the others print only a failure of
their own, never another rank's).
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import threading
import uuid

import torch
import torch.distributed as dist

from ...loaders.batching import engine as step_engine
from ...loaders.distributed.process_group import DEFAULT_TIMEOUT_S
from ..executor.execution import ExecutionResult
from .job_store import STORE_TIMEOUT_S, JobStore
from .outcomes import fail_as, failed_on_another_rank, outcome
from .plan_stream import StorePlans
from .prompt_channel import Lockstep, PromptChannel, RankFailed
from .ranks import JobRank, bound_alike

SECRET_BYTES = 32


class RankRun:
    """One rank's run of the job's prompt: its channel, its lockstep and its step engine (rank 0's leads)."""

    def __init__(self, joined: JobRank):
        store = joined.store if joined.store is not None else _store_for_host_group(joined)
        self.rank = joined.rank
        self.channel = PromptChannel(store, joined.rank, joined.world_size, DEFAULT_TIMEOUT_S)
        self.lockstep = Lockstep(self.channel, 0)
        self.engine = step_engine.StepEngine(
            max_batch=1, plans=StorePlans(store.connection(), joined.rank, joined.world_size),
            leads=joined.rank == 0, after_bind=bound_alike)

    @contextlib.contextmanager
    def running(self):
        """The body runs with this rank's step engine installed (rank 0's publishes its plans, the others'
        follow them)."""
        step_engine.install(self.engine)
        try:
            yield self
        finally:
            self.engine.close()
            step_engine.install(None)

    @contextlib.contextmanager
    def _interrupts_routed(self):
        """While the prompt runs (on the main thread): SIGINT asks rank 0's prompt to stop at its next forward
        or node; the other ranks leave the stopping to rank 0 (under torchrun the terminal's Ctrl-C reaches every
        rank) and stop where it did."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._on_interrupt)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _on_interrupt(self, _signum, _frame) -> None:
        if self.rank == 0:
            self.lockstep.requested.set()

    def agreed_prompt_id(self) -> str | None:
        """The prompt's id on every rank: rank 0 makes it and sends it down the channel. The step engines meet
        on it (rank 0's plan names its requests by prompt), so a rank with an id of its own would wait for a
        request that never comes. None on another rank when rank 0 ended before sending it."""
        if self.rank == 0:
            prompt_id = uuid.uuid4().hex
            self.channel.send({"kind": "run", "prompt_id": prompt_id})
            return prompt_id
        received = self.channel.receive()
        return None if received is None else received[1]["prompt_id"]

    def execute(self, executor, prompt: dict, extra_data: dict, on_event, execute_outputs: list) -> ExecutionResult:
        """The prompt on this rank; on rank 0 its result fails when any other rank's did, naming that rank."""
        prompt_id = self.agreed_prompt_id()
        result = ExecutionResult(success=False)
        if prompt_id is None:  # rank 0 is gone (it said why): this rank's prompt fails as another rank's
            fail_as(result, "", {"error": "rank 0 ended before the prompt started"}, on_event)
            return result
        try:
            with self._interrupts_routed():
                result = executor.execute(prompt, prompt_id, extra_data, on_event, self.lockstep.interrupt,
                                          execute_outputs, sync=self.lockstep)
        except RankFailed as exc:  # another rank failed before this one started a node
            fail_as(result, prompt_id, {"error": str(exc), "node_id": exc.node_id, "node_type": exc.node_type},
                    on_event)
        if self.rank != 0:  # its engine stops reading rank 0's store before rank 0 may end (and close it)
            self.engine.close()
        self.lockstep.finish(outcome(result, self.channel if self.rank else None))
        if self.rank == 0:
            late = [o for o in self.lockstep.outcomes().values() if not (o["success"] or o["interrupted"])]
            if result.success and late:  # a rank failed after the last sync point (a decode, a saver)
                fail_as(result, prompt_id, late[0], on_event)
        return result

    def reports(self, result: ExecutionResult) -> bool:
        """Whether this rank prints the result: rank 0 always; another rank only a failure of its own (rank 0
        says the rest, and a rank stuck in a collective cannot)."""
        return self.rank == 0 or not (result.success or result.interrupted or failed_on_another_rank(result))


@contextlib.contextmanager
def quiet_interrupt_until_running():
    """SIGINT on a rank before its prompt runs (meeting the others, loading, validating) ends it at once with 130
    and no traceback; while the prompt runs, ``RankRun`` routes it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_interrupted(_signum, _frame):
    raise SystemExit(130)


def _store_for_host_group(joined: JobRank) -> JobStore:
    """A host (a test harness) made the process group itself, so there is no job store: rank 0 hosts one on
    loopback and hands its port and a fresh secret to the others over the group (a tensor broadcast, no
    pickle). One host only, as such harnesses are."""
    message = torch.zeros(SECRET_BYTES + 1, dtype=torch.int64)
    store = None
    if joined.rank == 0:
        secret = secrets.token_bytes(SECRET_BYTES)
        store = JobStore.host(secret, "127.0.0.1", STORE_TIMEOUT_S)
        message[0] = store.port
        message[1:] = torch.tensor(list(secret), dtype=torch.int64)
    dist.broadcast(message, src=0)
    if store is None:
        secret = bytes(int(value) for value in message[1:])
        store = JobStore.connect(secret, "127.0.0.1", int(message[0]), STORE_TIMEOUT_S)
    return store
