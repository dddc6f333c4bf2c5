"""How a ``serve --ray --parallel`` replica settles one prompt over its ranks' results (no cluster needed): the
group survives only when every rank ended the prompt alike, and a failure names the rank that caused it."""

from __future__ import annotations

import pytest

from optional_extras import deferred, requires

pytestmark = requires("ray")
rank_group = deferred("lorabind.runtime.scale_out.rank_group")  # imports Ray: only when a test runs


def _success(fuses: int = 1) -> dict:
    return {"success": True, "outputs": {"8": {"images": []}}, "interrupted": False, "error": None, "fuses": fuses}


def _node_error(node: str, message: str) -> dict:
    return {"success": False, "interrupted": False, "fuses": 0,
            "error": {"node_id": node, "node_type": "LoraBindSampler", "exception_type": "RuntimeError",
                      "exception_message": message + "\n"}}


def test_ranks_that_agree_answer_with_rank_0_and_keep_the_group():
    ok0, ok1 = _success(fuses=2), _success(fuses=2)
    assert rank_group.settle({0: ok0, 1: ok1}, 2, 60.0) == (ok0, True)
    same0, same1 = _node_error("5", "no such LoRA"), _node_error("5", "no such LoRA")
    assert rank_group.settle({0: same0, 1: same1}, 2, 5.0) == (same0, True)  # every rank failed at the same node


def test_a_rank_failing_alone_fails_the_prompt_naming_it_and_the_group_is_restarted():
    answer, keep = rank_group.settle({0: _success(), 1: _node_error("5", "cannot read lora.safetensors")}, 2, 5.0)
    assert not keep and answer["failure"].startswith("rank 1 of 2: node 5 (LoraBindSampler) failed: RuntimeError: "
                                                     "cannot read lora.safetensors")


def test_a_dead_rank_is_named_before_the_rank_whose_collective_it_cut_off():
    lost = {"failure": "its actor stopped (ActorDiedError: ...)", "lost": True}
    answer, keep = rank_group.settle({0: _node_error("6", "gloo: Connection reset by peer"), 1: lost}, 2, 5.0)
    assert not keep and answer["failure"].startswith("rank 1 of 2: its actor stopped")


def test_a_rank_that_never_answers_is_named_with_the_bound_waited():
    answer, keep = rank_group.settle({0: _success(), 2: _success()}, 4, 60.0)
    assert not keep and answer["failure"].startswith("rank 1 of 4: did not finish within 60 s of the other ranks")


def test_an_interrupt_that_stopped_the_ranks_at_different_steps_stays_an_interrupt():
    interrupted = {"success": False, "interrupted": True, "error": None, "fuses": 0}
    assert rank_group.settle({0: interrupted}, 2, 5.0) == (interrupted, False)
    assert rank_group.settle({0: interrupted, 1: dict(interrupted)}, 2, 5.0) == (interrupted, True)


@pytest.mark.parametrize("argv, says", [
    (["--ray", "--parallel", "tp=2,ulysses=2"], "tp=2 cannot be combined with ulysses=2"),
    (["--ray", "--tensor-parallel-size", "2", "--parallel", "tp=4"], "--tensor-parallel-size 2 contradicts tp=4"),
])
def test_serve_refuses_a_spec_it_cannot_run_before_ray_or_any_rank_starts(argv, says, tmp_path, capsys):
    from lorabind.runtime.cli import main

    assert main(["serve", "--models", str(tmp_path), *argv]) == 2
    assert says in capsys.readouterr().out


def test_serve_reads_the_guide_flags_as_each_ray_replica_s_ranks():
    from lorabind.runtime.cli import build_parser
    from lorabind.runtime.parallel.options import parallel_spec

    args = build_parser().parse_args(["serve", "--ray", "auto", "--tensor-parallel-size", "2"])
    assert args.ray == "auto" and parallel_spec(args).tp == 2
