"""The process group of one parallel job, and the session's spec the loading and sampling code read.

Why session state: a workflow's loader and sampler nodes know nothing of ranks; ``lorabind run --parallel`` sets the
spec once per process and the loading sequence (sequence split) and the guided step (CFG split) ask here. Every
collective wait is bounded by the group's timeout, so a rank that dies makes the others fail, never hang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ..errors import LoraBindError
from .spec import ParallelSpec

DEFAULT_TIMEOUT_S = 600.0  # a collective that waits longer fails the rank: long enough for a 14B step on one GPU
MESH_NAMES = ("cfg", "ring", "ulysses", "tp")  # outermost first: a CFG pair of sequence or tp groups
MAX_DIGITS = 9  # a rank or world size of ten digits is no job this runtime starts


class ParallelRunError(LoraBindError):
    """A parallel job that cannot start or whose ranks disagree; the text names the rank(s)."""


@dataclass
class _Session:
    spec: ParallelSpec = ParallelSpec()
    mesh: object = None  # torch.distributed.device_mesh.DeviceMesh over MESH_NAMES, built once per job
    owns_group: bool = False  # this module made the default group (a test harness or a host may bring its own)


_session = _Session()


def rank_from_environment() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) set by torchrun or by our own launcher; None outside a job.

    Checked before any rendezvous, so a mistaken environment is one line at once, not a wait that never ends:
    each value in ASCII digits (Python's ``int`` also reads ``"٢"``), the rank below the world size, the local
    rank below the ranks per host (``ParallelRunError`` naming the variable)."""
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return None
    for name in ("RANK", "WORLD_SIZE"):
        if name not in os.environ:
            other = "WORLD_SIZE" if name == "RANK" else "RANK"
            raise ParallelRunError(f"{other} is set but {name} is not: a rank of a job needs both (torchrun sets "
                                   "them; unset both to run as one process)")
    rank, world = _count_variable("RANK"), _count_variable("WORLD_SIZE")
    if world < 1 or rank >= world:
        raise ParallelRunError(f"RANK={rank} with WORLD_SIZE={world}: the ranks of a job are numbered 0 to "
                               f"WORLD_SIZE-1, so RANK must be below WORLD_SIZE")
    local = _count_variable("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    local_world = _count_variable("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else world
    if not local < local_world <= world:
        raise ParallelRunError(f"LOCAL_RANK={local} with LOCAL_WORLD_SIZE={local_world} and WORLD_SIZE={world}: "
                               "the local rank must be below the ranks on this host, which cannot exceed the world")
    return rank, world, local


def _count_variable(name: str) -> int:
    value = os.environ[name]
    if not (value.isascii() and value.isdigit()) or len(value) > MAX_DIGITS:
        raise ParallelRunError(f"{name}={value[:20]!r} is not a whole number (ASCII digits 0-9)")
    return int(value)


def backend_for(device_type: str) -> str:
    """nccl between GPUs, gloo between CPU processes (the only two this runtime starts)."""
    return "nccl" if device_type == "cuda" else "gloo"


def join_job(spec: ParallelSpec, device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S,
             rendezvous: tuple | None = None) -> int:
    """Join (or reuse) the default process group of this job for ``spec``; returns this process's rank.
    ``rendezvous`` is (store, rank, world size) when the caller brings the store the group meets through (the
    runtime's authenticated one); without it torch reads MASTER_ADDR/MASTER_PORT (``env://``).
    The world size must be the spec's product of degrees: a torchrun with another ``--nproc-per-node`` is refused
    here, on every rank, before anything is loaded."""
    if not dist.is_initialized():
        meeting = {} if rendezvous is None else dict(zip(("store", "rank", "world_size"), rendezvous))
        dist.init_process_group(backend_for(device_type), timeout=timedelta(seconds=timeout_s), **meeting)
        _session.owns_group = True
    world = dist.get_world_size()
    if world != spec.world_size:
        raise ParallelRunError(f"--parallel {spec.describe()} needs {spec.world_size} ranks, but this job has "
                               f"{world} (torchrun --nproc-per-node must be {spec.world_size})")
    _session.spec = spec
    _session.mesh = None
    return dist.get_rank()


def leave_job() -> None:
    """Forget the spec; destroy the group if this process made one for the job."""
    if _session.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    _session.spec, _session.mesh, _session.owns_group = ParallelSpec(), None, False


def finish_job() -> None:
    """Leave after a body every rank completed: the ranks meet at a barrier first, so none tears its group down
    while another's last exchange is still in flight (gloo then aborts that process with SIGABRT)."""
    if _session.owns_group and dist.is_initialized():
        dist.barrier()
    leave_job()


def session_spec() -> ParallelSpec:
    return _session.spec


def job_mesh(device_type: str):
    """The job's DeviceMesh, dims ``MESH_NAMES``: built once, the same on every rank (a collective)."""
    if _session.mesh is None:
        spec = _session.spec
        _session.mesh = init_device_mesh(device_type, (spec.cfg, spec.ring, spec.ulysses, spec.tp),
                                         mesh_dim_names=MESH_NAMES)
    return _session.mesh


def tp_mesh(device_type: str):
    """The ranks that share this rank's tensor-parallel split: the job mesh's ``tp`` dimension (every rank, or
    under ``cfg=2`` the half running the same guidance pass). Innermost, so a split's ranks are neighbours."""
    return job_mesh(device_type)["tp"]


def gather_vectors(vector: torch.Tensor) -> list:
    """``vector`` (a small 1-D tensor, the same shape on every rank) of every rank, rank order, on the host, in one
    ``all_gather`` (bounded by the group's timeout); ``[vector]`` outside a job. NCCL gathers only device tensors,
    so there the vector travels through this rank's GPU."""
    if not dist.is_initialized():
        return [vector]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else vector.device
    local = vector.to(device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [value.cpu() for value in gathered]
