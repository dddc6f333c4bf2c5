"""The collectives of a parallel job on two gloo ranks: the CFG split runs one pass per rank and exchanges them,
and the binding fingerprints stop a job whose ranks bound different weights, naming the rank."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gloo_ranks import run_ranks
from lorabind.loaders.distributed import process_group
from lorabind.loaders.distributed.cfg_parallel import guidance_passes, unsplit_note
from lorabind.loaders.distributed.fingerprints import bound_state_fingerprint, check_same_binding
from lorabind.loaders.distributed.spec import parse_parallel

pytestmark = pytest.mark.slow


def _cfg_split(rank: int, world_size: int) -> dict:
    try:
        process_group.join_job(parse_parallel("ulysses=4"), "cpu")
        wrong_size = "joined"
    except process_group.ParallelRunError as refused:
        wrong_size = str(refused)
    process_group.join_job(parse_parallel("cfg=2"), "cpu")
    ran = []

    def one_pass(index):
        ran.append(index)
        return torch.full((2, 3), float(index + 1)), torch.tensor([10.0 * (index + 1)])

    passes = guidance_passes(one_pass, 2)
    note = unsplit_note(1.0)
    process_group.leave_job()
    return {"ran": ran, "video": [p[0] for p in passes], "audio": [p[1] for p in passes], "note": note,
            "wrong_size": wrong_size}


def test_cfg_two_runs_one_pass_per_rank_and_both_ranks_get_both(tmp_path):
    results = run_ranks(_cfg_split, out_dir=tmp_path)
    assert [r["ran"] for r in results] == [[0], [1]]  # rank 0 conditional, rank 1 unconditional
    for result in results:
        assert [v[0, 0].item() for v in result["video"]] == [1.0, 2.0]
        assert [a.item() for a in result["audio"]] == [10.0, 20.0]
        assert "cfg is 1 here" in result["note"]
        assert result["wrong_size"] == ("--parallel ulysses=4 needs 4 ranks, but this job has 2 (torchrun "
                                        "--nproc-per-node must be 4)")


def test_without_a_cfg_split_both_passes_run_here():
    assert guidance_passes(lambda index: index * 2, 2) == [0, 2] and unsplit_note(1.0) is None


def _fingerprints(rank: int, world_size: int) -> list:
    """Two checks in one job: the same binding on both ranks, then one value changed on rank 1."""
    outcomes = []
    for differ in (False, True):
        weight = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
        if differ and rank == 1:
            weight[1, 2] = 7.0  # one value of one patched tensor
        try:
            check_same_binding(_BindingState(), [("fuse", "a.safetensors", "transformer", 1.0)],
                               lambda weight=weight: [("blocks.0.weight", weight)])
            outcomes.append("same")
        except process_group.ParallelRunError as refused:
            outcomes.append(str(refused))
    return outcomes


def test_the_same_binding_passes_and_one_changed_value_stops_the_job_naming_the_rank(tmp_path):
    for same, refused in run_ranks(_fingerprints, out_dir=tmp_path):
        assert same == "same" and "the LoRA binding of rank(s) 1 differs from rank 0's" in refused


def test_a_fingerprint_follows_the_patch_set_and_every_bit():
    weight = torch.ones(4, dtype=torch.float32)
    base = bound_state_fingerprint([("fuse", "a", "transformer", 1.0)], [("w", weight)])
    assert torch.equal(base, bound_state_fingerprint([("fuse", "a", "transformer", 1.0)], [("w", weight.clone())]))
    assert not torch.equal(base, bound_state_fingerprint([("fuse", "a", "transformer", 0.5)], [("w", weight)]))
    assert not torch.equal(base, bound_state_fingerprint([("fuse", "a", "transformer", 1.0)],
                                                         [("w", torch.nextafter(weight, torch.tensor(2.0)))]))


@dataclasses.dataclass
class _BindingState:
    """The two fields of ``binding.bind.BindingState`` the check reads and keeps."""

    version: int = 0
    rank_fingerprint: object = None


def test_the_fingerprint_is_made_once_per_change_of_the_binding():
    state, made = _BindingState(), []
    weight = torch.ones(4)

    def tensors():
        made.append(state.version)
        return [("w", weight)]

    patch_set = [("fuse", "a", "transformer", 1.0)]
    for _ in range(3):  # sampler calls on an unchanged binding: the tensors are read once
        check_same_binding(state, patch_set, tensors)
    state.version += 1  # a bind wrote weights
    check_same_binding(state, patch_set, tensors)
    check_same_binding(state, [("fuse", "a", "transformer", 0.5)], tensors)  # another patch set
    assert made == [0, 1, 1]
