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


class ParallelRunError(LoraBindError):
    """A parallel job that cannot start or whose ranks disagree; the text names the rank(s)."""


@dataclass
class _Session:
    spec: ParallelSpec = ParallelSpec()
    mesh: object = None  # torch.distributed.device_mesh.DeviceMesh over MESH_NAMES, built once per job
    owns_group: bool = False  # this module made the default group (a test harness or a host may bring its own)


_session = _Session()


def rank_from_environment() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) set by torchrun or by our own launcher; None outside a job."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def backend_for(device_type: str) -> str:
    """nccl between GPUs, gloo between CPU processes (the only two this runtime starts)."""
    return "nccl" if device_type == "cuda" else "gloo"


def join_job(spec: ParallelSpec, device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Join (or reuse) the default process group of this job for ``spec``; returns this process's rank.
    The world size must be the spec's product of degrees: a torchrun with another ``--nproc-per-node`` is refused
    here, on every rank, before anything is loaded."""
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device_type), timeout=timedelta(seconds=timeout_s))
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
