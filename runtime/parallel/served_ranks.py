"""Rank 0's hold on the other ranks of a served job: it joins them, watches them, and when one is lost (died, or
stalled past ``--rank-timeout``) starts them again, or, when it did not start them (torchrun), says it cannot.

Why rank 0 supervises (``serve --parallel`` outside torchrun): the prompt queue and the history live in rank 0's
process, so a job that survives a lost rank must keep rank 0 and replace the others. Their process group cannot be
trusted after a loss (a survivor may be blocked in a collective the lost rank never joins), so every other rank is
stopped and started again, and rank 0 leaves the old group and meets the new ranks in a fresh namespace of the
job's store (a generation). The models are loaded again by the next prompt (their split refers to the old group).
"""

from __future__ import annotations

import os
import time

import torch

from ...loaders.distributed.process_group import DEFAULT_TIMEOUT_S, ParallelRunError, leave_job
from ...loaders.distributed.spec import ParallelSpec
from .job_environment import LAUNCHER, JobEnvironment, listen_interface, usable_cores
from .job_store import STORE_TIMEOUT_S, JobStore
from .launch import STOP_GRACE_S, new_secret, start_rank
from .liveness import Liveness
from .plan_stream import StorePlans
from .prompt_channel import PromptChannel
from .ranks import join_rank

GENERATION_VARIABLE = "LORABIND_JOB_GENERATION"  # which namespace of the store a started rank meets in
LOST_GRACE_S = 2.0  # a peer's connection closes a moment before its exit can be seen


def supervising(spec: ParallelSpec, argv: list[str], interface: str | None, rank_timeout_s: float) -> "ServedRanks":
    """Rank 0 of a job this process starts itself: its share of the cores, the store on the job's interface
    (loopback by default), and the other ranks started from ``argv``."""
    name, address = listen_interface(interface)
    if "OMP_NUM_THREADS" not in os.environ:  # this rank's share of the cores, as each rank it starts gets
        torch.set_num_threads(max(1, usable_cores() // spec.world_size))
    secret = new_secret()
    store = JobStore.host(secret.encode(), address, STORE_TIMEOUT_S)
    job = JobEnvironment(0, spec.world_size, 0, address, store.port, LAUNCHER, secret.encode(), name, address)
    return ServedRanks(spec, job, rank_timeout_s, store=store, argv=argv)


class ServedRanks:
    """``argv``: the command line of the ranks this process starts (so it can start them again); None when they
    were started by torchrun or by hand. ``channel`` is the current generation's ``PromptChannel``, ``plans`` its
    step engines' plan stream."""

    def __init__(self, spec: ParallelSpec, job: JobEnvironment, rank_timeout_s: float, *,
                 store: JobStore | None = None, argv: list[str] | None = None):
        self.spec, self.job, self.rank_timeout_s, self.argv = spec, job, rank_timeout_s, argv
        self.store = store
        self.generation = 0
        self.processes: dict = {}
        self.channel: PromptChannel | None = None
        self.plans: StorePlans | None = None  # the step engines' plans, this generation's (``plan_stream``)
        self.liveness: Liveness | None = None

    @property
    def can_restart(self) -> bool:
        return self.argv is not None

    def start(self) -> None:
        """Start ranks 1..N-1 (when this process supervises them) and meet them as rank 0, in a new generation."""
        self.generation += 1
        if self.can_restart:
            self.processes = {rank: start_rank(rank, self.spec.world_size, self.argv, self.store,
                                               self.job.secret.decode(), self.job.address,
                                               {GENERATION_VARIABLE: str(self.generation)})
                              for rank in range(1, self.spec.world_size)}
        try:
            joined = join_rank(self.spec, self.job, self.store, f"g{self.generation}", alive=self._started_alive)
        except BaseException:
            self._end_processes(0.0)
            raise
        self.liveness = Liveness(joined.store.connection(), self.spec.world_size, self.rank_timeout_s,
                                 self.processes, joined.peers).start()
        self.channel = PromptChannel(joined.store, 0, self.spec.world_size, DEFAULT_TIMEOUT_S,
                                     lost=self.liveness.lost)
        self.plans = StorePlans(joined.store.connection(), 0, self.spec.world_size)

    def lost(self) -> str | None:
        return self.liveness.lost() if self.liveness is not None else None

    def wait_lost(self) -> str | None:
        return self.liveness.wait_lost(LOST_GRACE_S) if self.liveness is not None else None

    def restart(self) -> None:
        """Stop every other rank (they may be blocked in a collective), leave the group, start them again."""
        if not self.can_restart:
            raise ParallelRunError("ranks started by torchrun cannot be started again by the job")
        self._end_processes(0.0)
        leave_job()
        self.start()

    def stop(self) -> int:
        """Tell the other ranks to stop, wait for them (killing what is left after the grace period), leave the
        group; 0 when every rank this process started ended with 0."""
        if self.channel is not None and self.lost() is None:
            try:
                self.channel.send({"kind": "stop"})
            except RuntimeError:  # the store is gone: nothing left to tell
                pass
        codes = self._end_processes(STOP_GRACE_S)
        leave_job()
        return 0 if all(code == 0 for code in codes) else 1

    def _started_alive(self) -> str | None:
        """Why a rank this process started cannot join (it exited while the others waited for it)."""
        for rank, process in sorted(self.processes.items()):
            if process.poll() is not None:
                return f"rank {rank} of {self.spec.world_size} exited before it joined (exit code {process.poll()})"
        return None

    def _end_processes(self, grace_s: float) -> list:
        if self.liveness is not None:
            self.liveness.stop()
        deadline = time.monotonic() + grace_s
        codes = []
        for process in self.processes.values():
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if process.poll() is None:
                process.kill()
            codes.append(process.wait())
        return codes
