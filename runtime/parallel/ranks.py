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

import torch
import torch.distributed as dist

from ...loaders.distributed.process_group import finish_job, join_job, leave_job
from ...loaders.distributed.spec import ParallelSpec
from ...loaders.placement.devices import resolve_device, session_defaults, set_session_defaults


@contextlib.contextmanager
def rank_of_job(spec: ParallelSpec, local_rank: int):
    """Join the job as this process's rank for the body; yields (rank, is_rank_zero). On a GPU machine a rank
    whose device is left on auto runs on ``cuda:LOCAL_RANK`` (one GPU each)."""
    device = resolve_device(session_defaults()["device"])
    if device.type == "cuda" and device.index in (None, 0) and local_rank:
        torch.cuda.set_device(local_rank)
        set_session_defaults(device=f"cuda:{local_rank}", memory=session_defaults()["memory"])
        device = resolve_device(f"cuda:{local_rank}")
    rank = join_job(spec, device.type)
    try:
        yield rank, rank == 0
    except BaseException:
        leave_job()  # no barrier: the other ranks may never reach one (the launcher stops them)
        raise
    finish_job()


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
