"""``serve --parallel ulysses=2 --max-batch 2`` (issue 53 part 3, the one rank protocol): two prompts in flight on
two gloo ranks, their steps batched by rank 0's step engine and followed by rank 1's, give what one process gives
each of them alone; an interrupt of one of them (by its prompt id) stops it on both ranks at the same forward, as
an interrupt, while the other finishes on both.

Measured on this machine (2 cores, one thread per rank): the batched outputs differ from one process's by at most
the bound asserted, ``TOLERANCE`` (the engine's float32 rows, ``engine_helpers``, plus the sequence split's
reordered sums); the two ranks' outputs are equal."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
import torch

import lorabind
from gloo_ranks import RANK_TIMEOUT_S
from lorabind.loaders.models.store import clear_cache
from lorabind.runtime.cli import main
from lorabind.runtime.parallel.launch import free_port
from saver_capture import capturing_savers
from served_jobs import served_job
from server_client import Client, run_async

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TEMPLATE = Path(lorabind.__file__).parent / "workflows" / "api" / "qwen_image_lightning.api.json"
TOLERANCE = 1e-5
SEEDS = (11, 12)


def _prompt(seed: int) -> dict:
    prompt = json.loads(TEMPLATE.read_text())
    prompt["6"]["inputs"]["seed"] = seed
    prompt["2"]["inputs"]["text"] = f"a red car, seed {seed}"
    return prompt


@pytest.fixture(scope="module")
def alone(tiny_models_root, tmp_path_factory) -> dict:
    """Each prompt's output in one process, run on its own."""
    root, outputs = tmp_path_factory.mktemp("alone"), {}
    for seed in SEEDS:
        path = root / f"{seed}.api.json"
        path.write_text(json.dumps(_prompt(seed)))
        with capturing_savers() as captured:
            assert main(["run", str(path), "--models", str(tiny_models_root), "--output", str(root / "out"),
                         "--input", str(root / "input")]) == 0
        outputs[seed] = next(iter(captured.values()))
    clear_cache()
    return outputs


@pytest.fixture(scope="module")
def job(tiny_models_root, tmp_path_factory):
    root, port = tmp_path_factory.mktemp("parallel_batched"), free_port()
    (root / "loras").mkdir()
    argv = ["serve", "--port", str(port), "--models", str(tiny_models_root), "--output", str(root / "output"),
            "--input", str(root / "input"), "--temp", str(root / "temp"), "--state-dir", str(root / "state"),
            "--parallel", "ulysses=2", "--max-batch", "2"]
    with served_job(port, argv, root / "captures", [str(root / "loras")] * 2) as served:
        yield served


async def _both(url: str, interrupt_second_at: int | None = None) -> list:
    """Both prompts at once, each from its own client; the second interrupted by id after that many steps."""
    async def one(index: int, seed: int):
        client = Client(url, client_id=f"batched-{index}")
        await client.connect()
        try:
            prompt_id = (await client.queue_prompt(_prompt(seed)))["prompt_id"]
            while True:
                message = await client.receive(timeout=RANK_TIMEOUT_S)
                data = message.get("data", {})
                if data.get("prompt_id") != prompt_id:
                    continue
                if index == 1 and message["type"] == "progress" and data["value"] == interrupt_second_at:
                    assert (await client.post("/interrupt", {"prompt_id": prompt_id}))[0] == 200
                if message["type"] == "executing" and data.get("node") is None:
                    break
            _, history = await client.get(f"/history/{prompt_id}")
            return history[prompt_id]
        finally:
            await client.close()
    return await asyncio.gather(*(one(i, seed) for i, seed in enumerate(SEEDS)))


def test_two_prompts_in_flight_on_two_ranks_equal_their_runs_alone(job, alone):
    before = len(job.captured(0))
    entries = run_async(_both, job.url)
    assert [e["status"]["status_str"] for e in entries] == ["success", "success"]
    ours, theirs = job.captured(0)[before:], job.captured(1)[before:]
    assert len(ours) == len(theirs) == 2
    reports = [next(out["lorabind_schedule"][0] for out in e["outputs"].values() if "lorabind_schedule" in out)
               for e in entries]
    assert max(r["batching"]["largest_batch"] for r in reports) == 2
    for output, other in zip(ours, theirs):
        assert torch.equal(output, other)  # rank 1 ran rank 0's batches, in rank 0's order
    differences = sorted(min((o - alone[s]).abs().max().item() for s in SEEDS) for o in ours)
    print(f"serve --parallel ulysses=2 --max-batch 2: max |difference| {differences[-1]:.3g}")
    assert differences[-1] <= TOLERANCE


def _free(url: str) -> None:
    """Every rank drops its cached outputs: the same prompts run again instead of replaying."""
    request = urllib.request.Request(url + "/free", json.dumps({"free_memory": True}).encode(),
                                     {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()


def test_an_interrupt_of_one_prompt_stops_it_on_every_rank_and_the_other_finishes(job, alone):
    _free(job.url)
    before = len(job.captured(0))
    entries = run_async(_both, job.url, 2)
    assert entries[0]["status"]["status_str"] == "success"
    assert "execution_interrupted" in [m[0] for m in entries[1]["status"]["messages"]]
    ours, theirs = job.captured(0)[before:], job.captured(1)[before:]
    assert len(ours) == len(theirs) == 1  # the interrupted prompt saved nothing on either rank
    assert torch.equal(ours[0], theirs[0])
    assert (ours[0] - alone[SEEDS[0]]).abs().max().item() <= TOLERANCE
