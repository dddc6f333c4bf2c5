"""The lockstep of a served ``--parallel`` job, without processes: two "ranks" are two threads sharing one in-memory
store (torch's ``HashStore``, the same interface as the job's ``TCPStore``). What rank 0 decides at a sync point:
go, stop (an interrupt asked for at any moment is taken at the same point on every rank), fail naming the rank
that failed, fail when the ranks reached different points, and fail, not hang, when a rank never arrives."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from lorabind.runtime.parallel.job_store import JobStore
from lorabind.runtime.parallel.prompt_channel import Lockstep, PromptChannel, RankFailed

SECRET = b"a test job's secret, 32 bytes.."


def _channels(timeout_s: float = 5.0, world_size: int = 2) -> list[PromptChannel]:
    store = JobStore(dist.HashStore(), SECRET)
    return [PromptChannel(store, rank, world_size, timeout_s) for rank in range(world_size)]


def _on_threads(*bodies) -> list:
    """Run each body on its own thread; what each returned or raised, in order."""
    results: list = [None] * len(bodies)

    def run(index, body):
        try:
            results[index] = body()
        except Exception as exc:  # the assertions look at it
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i, body)) for i, body in enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def _steps(lockstep: Lockstep, labels: list[str]):
    def body():
        for label in labels:
            lockstep.checkpoint(label)
            if lockstep.agreed.is_set():
                return f"stopped at {label}"
        return "done"
    return body


def test_commands_arrive_in_order_and_the_ranks_go_on_together():
    leader, follower = _channels()
    leader.send({"kind": "free", "unload": False})
    number = leader.send({"kind": "prompt", "prompt": {"1": {}}})
    assert follower.receive() == (0, {"kind": "free", "unload": False})
    assert follower.receive() == (number, {"kind": "prompt", "prompt": {"1": {}}})
    steps = ["executing of node 1", "progress of node 1", "progress of node 1"]
    ours, theirs = Lockstep(leader, number), Lockstep(follower, number)
    assert _on_threads(_steps(ours, steps), _steps(theirs, steps)) == ["done", "done"]
    theirs.finish({"success": True, "interrupted": False, "error": None})
    assert ours.outcomes() == {1: {"success": True, "interrupted": False, "error": None}}
    ours.forget(number)
    assert not leader.has(f"cmd{number}") and not leader.has("p1/at0/go") and not leader.has("p1/done/r1")


def test_an_interrupt_stops_every_rank_at_the_same_sync_point():
    leader, follower = _channels()
    requested = threading.Event()
    ours, theirs = Lockstep(leader, 0, requested), Lockstep(follower, 0)
    steps = [f"progress of node 6 step {n}" for n in range(50)]

    def leader_body():
        for label in steps:
            if label.endswith("step 3"):
                requested.set()  # as /interrupt does, from another thread, between two points
            ours.checkpoint(label)
            if ours.agreed.is_set():
                return label
        return "done"

    assert _on_threads(leader_body, _steps(theirs, steps)) == ["progress of node 6 step 3",
                                                                "stopped at progress of node 6 step 3"]


def test_a_failure_on_one_rank_stops_the_other_at_its_next_point_naming_the_rank_and_node():
    leader, follower = _channels()
    ours, theirs = Lockstep(leader, 0), Lockstep(follower, 0)

    def follower_body():
        theirs.checkpoint("executing of node 5")
        theirs.report_failure("5", "FuseDistillLoRA", "lora.safetensors: not a safetensors file\n")

    def leader_body():
        ours.checkpoint("executing of node 5")
        ours.checkpoint("executing of node 6")

    failure, _ = _on_threads(leader_body, follower_body)
    assert isinstance(failure, RankFailed) and (failure.node_id, failure.node_type) == ("5", "FuseDistillLoRA")
    assert str(failure) == "rank 1 of 2 failed at node 5 (FuseDistillLoRA): lora.safetensors: not a safetensors file"
    ours.report_failure("6", "LoraBindSampler", str(failure))  # the executor's echo of it: not a second failure
    assert "rank 1" in leader.read("p0/failed")["why"]


def test_ranks_at_different_points_fail_saying_where_each_was():
    leader, follower = _channels()
    results = _on_threads(lambda: Lockstep(leader, 0).checkpoint("executing of node 5"),
                          lambda: Lockstep(follower, 0).checkpoint("executing of node 6"))
    assert all(isinstance(r, RankFailed) for r in results)
    assert str(results[0]) == ("the ranks lost step: rank 0 at the executing of node 5, "
                               "rank 1 at the executing of node 6")


@pytest.mark.parametrize("waiting_rank", [0, 1])
def test_a_rank_that_never_arrives_fails_the_wait_within_the_bound(waiting_rank):
    channel = _channels(timeout_s=0.3)[waiting_rank]
    started = time.monotonic()
    with pytest.raises(RankFailed, match="within 0.3 s"):
        Lockstep(channel, 0).checkpoint("executing of node 1")
    assert time.monotonic() - started < 2.0
