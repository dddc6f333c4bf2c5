"""What one rank of a ``--parallel`` job does differently from a single process.

Every rank runs the whole graph (SPMD: the same seed and inputs, so the same noise), because every rank takes part
in each split step. Only rank 0 is seen: the other ranks print nothing, show no progress and write their files
into a scratch folder that is removed afterwards, so the user's output folder gets one copy.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...loaders.distributed.process_group import ParallelRunError, finish_job, join_job, leave_job
from ...loaders.distributed.spec import ParallelSpec
from ...loaders.placement.devices import resolve_device, session_defaults, set_session_defaults
from ...usecases.sampling import check_ranks_bound_alike
from .job_environment import (
    LAUNCHER,
    MEET_TIMEOUT_S,
    STORE_VARIABLE,
    JobEnvironment,
    bind_collectives_to,
    rendezvous_timeout,
)
from .job_store import STORE_TIMEOUT_S, JobStore
from .launch import exit_with_parent


@dataclass
class JobRank:
    """This process's place in a joined job; ``store`` is the job's authenticated store (the generation's
    namespace), None when the host brought its own process group."""

    rank: int
    world_size: int
    store: JobStore | None = None
    peers: dict = field(default_factory=dict)  # rank -> {"pid", "host"}, from the meeting

    @property
    def seen(self) -> bool:
        return self.rank == 0


@contextlib.contextmanager
def rank_of_job(spec: ParallelSpec, job: JobEnvironment | None, store: JobStore | None = None,
                namespace: str = ""):
    """Join the job as this process's rank for the body; yields its ``JobRank``. ``job`` None: the host made the
    process group already (a test harness); else the ranks meet through the job's store (``store``, or the one
    ``job`` names), within ``namespace`` (a generation of a served job's ranks)."""
    joined = join_rank(spec, job, store, namespace)
    try:
        yield joined
    except BaseException:
        leave_job()  # no barrier: the other ranks may never reach one (the launcher stops them)
        raise
    finish_job()


def join_rank(spec: ParallelSpec, job: JobEnvironment | None, store: JobStore | None = None,
              namespace: str = "", alive=None) -> JobRank:
    """Meet the other ranks and join the process group (bounded: ``ParallelRunError`` naming what is missing;
    ``alive()`` may say at once why a rank will never come). On a GPU machine a rank whose device is left on auto
    runs on ``cuda:LOCAL_RANK`` (one GPU each)."""
    device = _rank_device(job.local_rank if job is not None else 0)
    if job is None or dist.is_initialized():
        rank = join_job(spec, device.type)
        return JobRank(rank, dist.get_world_size())
    if job.world_size != spec.world_size:  # before waiting for ranks that will never come
        raise ParallelRunError(f"--parallel {spec.describe()} needs {spec.world_size} ranks, but WORLD_SIZE is "
                               f"{job.world_size} (torchrun --nproc-per-node must be {spec.world_size})")
    if os.environ.get(STORE_VARIABLE) == LAUNCHER:  # started by our launcher, in a session of its own
        exit_with_parent()
    bind_collectives_to(job.interface)
    store = store or open_job_store(job)
    store = store.within(namespace) if namespace else store
    peers = store.meet(job.rank, job.world_size, MEET_TIMEOUT_S, alive)
    rank = join_job(spec, device.type, rendezvous=(store.group_store(), job.rank, job.world_size))
    return JobRank(rank, job.world_size, store, peers)


def open_job_store(job: JobEnvironment) -> JobStore:
    """The job's store: started here when this is rank 0 of ranks started by hand, else reached where the
    environment says (our launcher's, torchrun's agent's, or rank 0's)."""
    if job.hosts_store:
        return JobStore.host(job.secret, job.address, STORE_TIMEOUT_S, job.master_port)
    return JobStore.connect(job.secret, job.master_addr, job.master_port, rendezvous_timeout())


def _rank_device(local_rank: int):
    device = resolve_device(session_defaults()["device"])
    if device.type == "cuda" and device.index in (None, 0) and local_rank:
        torch.cuda.set_device(local_rank)
        set_session_defaults(device=f"cuda:{local_rank}", memory=session_defaults()["memory"])
        device = resolve_device(f"cuda:{local_rank}")
    return device


@contextlib.contextmanager
def unseen_rank():
    """A rank other than 0: stdout to the null device for the body; yields (a scratch output folder, removed
    afterwards, and the null stream for the progress display)."""
    with tempfile.TemporaryDirectory(prefix="lorabind-rank-") as scratch, open(os.devnull, "w") as null:
        stdout, sys.stdout = sys.stdout, null
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # rank 0 shows the library's warnings once
                yield scratch, null
        finally:
            sys.stdout = stdout


@contextlib.contextmanager
def rank_zero_builds_first():
    """Rank 0 builds the missing built-in models while the others wait, then they find them built: two ranks
    writing one model folder at once would race (torchrun starts every rank without a parent to build first)."""
    if dist.get_rank() != 0:
        dist.barrier()
    try:
        yield
    finally:
        if dist.get_rank() == 0:
            dist.barrier()


def bound_alike(model, base) -> None:
    """The step engine's ``after_bind`` on a rank: every rank has just bound the same patches (a collective every
    rank's engine reaches at the same plan)."""
    check_ranks_bound_alike(model, base.adapters)
