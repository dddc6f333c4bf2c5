"""CFG parallelism: a guided step's conditional and unconditional passes on two ranks, exchanged afterwards.

Why it is exact: each pass is the same forward the single process runs (same weights, same inputs), only on
another rank; the all-gather brings both results to both ranks, which then combine them as one process would.
Every family's guided step asks ``guidance_passes`` (the shared ``generation.sampling.guided`` and MiniMax-H3's
own loop), so the split lives here once.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from .process_group import job_mesh, session_spec
from .spec import CFG_BRANCHES


def guidance_passes(run_pass: Callable[[int], object], count: int) -> list:
    """``[run_pass(0), …, run_pass(count - 1)]``: pass 0 conditional, pass 1 unconditional. Under ``cfg=2`` with
    two passes, each cfg rank runs one and both results are exchanged (a tensor, or a tuple of tensors)."""
    if session_spec().cfg != CFG_BRANCHES or count != CFG_BRANCHES:
        return [run_pass(index) for index in range(count)]
    cfg_mesh = _cfg_mesh()
    index = cfg_mesh.get_local_rank()
    mine = run_pass(index)
    return _exchanged(mine, cfg_mesh.get_group())


def unsplit_note(cfg) -> str | None:
    """The run's line when ``cfg=2`` was asked for but the guidance is 1 (a distill contract): one pass per step,
    nothing to split."""
    values = cfg if isinstance(cfg, (tuple, list)) else (cfg,)
    if session_spec().cfg != CFG_BRANCHES or any(float(v) != 1.0 for v in values):
        return None
    return ("--parallel cfg=2 has nothing to split: cfg is 1 here (one pass per step, as a distill contract "
            "asks), so both cfg ranks run each step whole")


def _cfg_mesh():
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return job_mesh(device)["cfg"]


def _exchanged(mine, group) -> list:
    """Both ranks' results, cfg-rank order, each shaped as ``mine`` (a tensor or a tuple of tensors)."""
    parts = mine if isinstance(mine, tuple) else (mine,)
    gathered = []
    for tensor in parts:
        tensor = tensor.contiguous()
        slots = [torch.empty_like(tensor) for _ in range(CFG_BRANCHES)]
        dist.all_gather(slots, tensor, group=group)
        gathered.append(slots)
    per_rank = [tuple(slots[rank] for slots in gathered) for rank in range(CFG_BRANCHES)]
    return per_rank if isinstance(mine, tuple) else [result[0] for result in per_rank]
