"""The one rank protocol (issue 53 part 3), in one process: a leading engine decides every forward and publishes it,
a following engine (another rank's, here over its own copy of the model) runs exactly those forwards in that
order. Both ranks' requests give the same latents, bit for bit; an interrupt on rank 0 stops the same request at
the same forward on the follower, as an interrupt; the other requests finish on both."""

from __future__ import annotations

import queue
import shutil
import threading

import pytest
import torch

from engine_helpers import on_threads
from lorabind.loaders.batching.engine import StepEngine, used
from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text
from lorabind.loaders.handles import ModelHandle
from lorabind.loaders.models.store import load_model
from lorabind.runtime.context import ExecutionContext, InterruptedByUser, reset_current_context, set_current_context
from lorabind.usecases.sampling import SampleOptions, sample


class QueuePlans:
    """An in-process plan stream; ``published`` keeps what rank 0 decided, in order."""

    def __init__(self):
        self.queue, self.published = queue.Queue(), []

    def publish(self, plan: dict) -> None:
        self.published.append(plan)
        self.queue.put(plan)

    def receive(self, timeout_s: float):
        try:
            return self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None


@pytest.fixture(scope="module")
def two_copies(tiny_models_root, tmp_path_factory):
    """The tiny Wan2.1 model twice, as two ranks each hold it: copies of their own, so the session's shared model
    (other tests') is not the one these bind and name."""
    models = []
    for rank in range(2):
        copy = tmp_path_factory.mktemp(f"rank{rank}") / "tiny-wan21-t2v"
        shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", copy)
        models.append(load_model(str(copy), name=f"rank{rank}"))
    return models


def _rank_jobs(engine, model, flags: list, stop_after: dict) -> list:
    """Three requests on ``engine``; request ``i`` reads ``flags[i]`` as its interrupt flag, and sets it after
    ``stop_after[i]`` steps (rank 0 only)."""
    handle = ModelHandle(model)
    negative, latent = encode_text(model, "blurry"), empty_latent(model, 32, 32, 5)
    prompts = [encode_text(model, text) for text in ("a cat", "a dog", "a bird")]

    def job(i):
        def after_step(done, total):
            if stop_after.get(i) == done:
                flags[i].set()

        context = ExecutionContext(prompt_id="prompt", node_id=str(i), interrupt_event=flags[i])
        token = set_current_context(context)  # as the executor runs a node: the request's name and its flag
        try:
            with used(engine):
                options = SampleOptions(seed=i, steps=4, cfg=1.0 + i, shift=5.0)
                return sample(handle, prompts[i], negative, latent, options, on_step=after_step,
                              check_interrupt=context.check_interrupted)[0].samples
        finally:
            reset_current_context(token)

    return [lambda i=i: job(i) for i in range(3)]


def test_a_follower_runs_rank_zeros_forwards_and_stops_where_rank_zero_stopped(two_copies):
    plans = QueuePlans()
    leader = StepEngine(max_batch=3, gather_window_s=5.0, plans=plans)
    follower = StepEngine(max_batch=3, plans=plans, leads=False, follow_timeout_s=60)
    flags = [[threading.Event() for _ in range(3)] for _ in range(2)]
    try:
        results = on_threads(_rank_jobs(leader, two_copies[0], flags[0], {1: 2})
                             + _rank_jobs(follower, two_copies[1], flags[1], {}))
    finally:
        leader.close()
        follower.close()
    rank0, rank1 = results[:3], results[3:]
    assert isinstance(rank0[1][1], InterruptedByUser) and isinstance(rank1[1][1], InterruptedByUser)
    for (mine, error), (theirs, other_error) in zip(rank0[::2], rank1[::2]):
        assert error is None and other_error is None
        assert torch.equal(mine, theirs)  # the same batches, in the same order: the same bits
    batches = [plan for plan in plans.published if "batch" in plan]
    assert max(len(plan["batch"]) for plan in batches) == 3
    assert {"left": ("prompt", "1", 0), "why": "interrupted"} in plans.published
    interrupted_forwards = [index for plan in batches for key, index in plan["batch"] if key[1] == "1"]
    assert interrupted_forwards == [0, 1, 2, 3]  # cfg 2: two forwards a step, stopped before step 3
