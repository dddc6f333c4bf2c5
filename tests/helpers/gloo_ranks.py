"""Run one function on N CPU ranks over gloo, each in a fresh process, and collect what every rank returns.

Why fresh processes (spawn, not fork): a forked child inherits torch's thread pools and any process group of the
parent, and gloo hangs on them; a spawned child starts clean and imports the test module by name (the parent's
``sys.path`` travels with it). Why files for the results: a rank returns tensors, and ``torch.save`` /
``torch.load(weights_only=True)`` carry them without pickling arbitrary objects back into the test process.
Every rank runs with one intra-op thread, so two ranks on a 2-core machine do not fight over the cores.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

from lorabind.runtime.parallel.launch import free_port

RANK_TIMEOUT_S = 120  # a collective that waits longer than this fails the rank instead of hanging the test


def _rank_main(rank: int, world_size: int, port: int, out_dir: str, fn, args: tuple) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=RANK_TIMEOUT_S))
    outcome = {"ok": True, "result": None}
    try:
        outcome["result"] = fn(rank, world_size, *args)
    except BaseException:  # reported to the test process, which fails with the rank's traceback
        outcome = {"ok": False, "result": traceback.format_exc()}
    finally:
        dist.destroy_process_group()
        torch.save(outcome, Path(out_dir) / f"rank{rank}.pt")


def run_ranks(fn, *args, world_size: int = 2, out_dir: str | os.PathLike) -> list:
    """``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks (``fn`` must be a module-level function);
    returns each rank's result, rank 0 first. Raises AssertionError with the traceback of every rank that failed."""
    port = free_port()
    mp.start_processes(_rank_main, args=(world_size, port, str(out_dir), fn, args), nprocs=world_size,
                       join=True, start_method="spawn")
    outcomes = [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=True) for rank in range(world_size)]
    failed = [f"rank {rank}:\n{o['result']}" for rank, o in enumerate(outcomes) if not o["ok"]]
    assert not failed, "\n".join(failed)
    return [o["result"] for o in outcomes]
