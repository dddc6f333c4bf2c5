"""The gloo rank runner the parallel tests stand on: every rank runs, collectives meet, and a failing rank fails
the test with its own traceback instead of hanging it."""

import pytest
import torch
import torch.distributed as dist

from gloo_ranks import run_ranks


def _all_reduced_rank_numbers(rank: int, world_size: int) -> dict:
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return {"rank": rank, "sum": value}


def _rank_one_fails(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    return rank


def test_every_rank_runs_and_the_collective_meets(tmp_path):
    results = run_ranks(_all_reduced_rank_numbers, out_dir=tmp_path)
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["sum"].item() for r in results] == [3.0, 3.0]


def test_a_failing_rank_fails_the_test_with_its_traceback(tmp_path):
    with pytest.raises(AssertionError, match="rank 1:(.|\n)*rank one fails on purpose"):
        run_ranks(_rank_one_fails, out_dir=tmp_path)
