"""``serve --max-batch N`` end to end through HTTP and the WebSocket (issue 53): prompts in flight at once,
their steps batched, each client's output equal to the same prompt served one at a time (PNG frames, within one
8-bit level: the engine's float32 tolerance, ``engine_helpers``), mixed LoRAs among them; ``/interrupt`` with a
prompt id stops only that prompt; 200 prompts from 8 threads, mixed LoRAs and some invalid, none lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from engine_helpers import on_threads
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from server_client import Client, run_async
from serving_helpers import STYLE_NAMES, frames_of, styled_prompt, write_styles

pytestmark = pytest.mark.slow  # whole workflows through a server

@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    from lorabind.tiny_models import build_tiny, lora_fixtures

    root = tmp_path_factory.mktemp("batched") / "models"
    build_tiny(root, names=["tiny-wan22-t2v"])
    lora_fixtures.write_fixture_loras(root)
    write_styles(root)
    return root


def _server(root: Path, tmp: Path, max_batch: int) -> BackgroundServer:
    config = ServerConfig(port=0, models_root=str(root), output_dir=str(tmp / "output"),
                          input_dir=str(tmp / "input"), temp_dir=str(tmp / "temp"), max_batch=max_batch)
    return BackgroundServer(config).start()


async def _each(url: str, prompts: list) -> list:
    """Each prompt from its own client, all at once."""
    clients = [Client(url, client_id=f"user-{i}") for i in range(len(prompts))]
    try:
        for client in clients:
            await client.connect()
        return await asyncio.gather(*(frames_of(c, p) for c, p in zip(clients, prompts)))
    finally:
        for client in clients:
            await client.close()


PROMPTS = [(1, "a cat dancing", 51), (2, "a red fox", None), (3, "a lighthouse", 61), (4, "a tram", None)]


@pytest.fixture(scope="module")
def served_alone(models_root, tmp_path_factory):
    """The four prompts served one at a time (``--max-batch 1``): what each user gets alone."""
    server = _server(models_root, tmp_path_factory.mktemp("serial"), 1)
    try:
        async def one_by_one():
            client = Client(server.url)
            await client.connect()
            try:
                return [await frames_of(client, styled_prompt(*p)) for p in PROMPTS]
            finally:
                await client.close()
        return run_async(one_by_one)
    finally:
        server.stop()


def test_prompts_in_flight_are_batched_and_each_equals_its_run_alone(models_root, tmp_path, served_alone):
    server = _server(models_root, tmp_path, 4)
    try:
        results = run_async(_each, server.url, [styled_prompt(*p) for p in PROMPTS])
    finally:
        server.stop()
    for (frames, _, seen), (alone, alone_report, _) in zip(results, served_alone):
        assert frames.shape == alone.shape == (5, 32, 32, 3)
        assert int(np.abs(frames - alone).max()) <= 1
        assert "batching" not in alone_report  # one at a time reports as before
        steps = [m["data"]["value"] for m in seen if m["type"] == "progress" and m["data"]["node"] == "6"]
        assert steps == [1, 2, 3, 4]  # its own progress events, to its own client
    batching = [report["batching"] for _, report, _ in results]
    assert max(b["largest_batch"] for b in batching) >= 2
    assert batching[0]["row_applied"] == list(STYLE_NAMES[51]) and batching[1]["row_applied"] == []


def test_an_interrupt_with_a_prompt_id_stops_only_that_prompt(models_root, tmp_path, served_alone):
    server = _server(models_root, tmp_path, 3)

    async def body():
        clients = [Client(server.url, client_id=f"user-{i}") for i in range(3)]
        for client in clients:
            await client.connect()
        victim = (await clients[1].queue_prompt(styled_prompt(*PROMPTS[1])))["prompt_id"]
        others = [asyncio.create_task(frames_of(clients[i], styled_prompt(*PROMPTS[i]))) for i in (0, 2)]
        while True:  # the victim's first step done: interrupt it, by id
            message = await clients[1].receive(timeout=120)
            if message["type"] == "progress" and message["data"].get("prompt_id") == victim:
                break
        status, _ = await clients[1].post("/interrupt", {"prompt_id": victim})
        assert status == 200
        seen = await clients[1].wait_done(victim, timeout=300)
        done = await asyncio.gather(*others)
        for client in clients:
            await client.close()
        return seen, done

    try:
        seen, done = run_async(body)
    finally:
        server.stop()
    assert "execution_interrupted" in [m["type"] for m in seen]
    for (frames, _, _), index in zip(done, (0, 2)):
        assert int(np.abs(frames - served_alone[index][0]).max()) <= 1


def _mixed(index: int) -> tuple:
    """Prompt ``index`` of the load: every 10th asks 20 steps of the 4-step pair (refused at /prompt), every 10th
    but 5 names a LoRA that does not exist (refused by validation); the rest rotate over two style LoRAs and none."""
    prompt = styled_prompt(index, f"prompt {index}", (51, 61, None)[index % 3], frames=1)
    if index % 10 == 0:
        prompt["6"]["inputs"]["steps"] = 20
        return prompt, False
    if index % 10 == 5:
        prompt["5"]["inputs"]["high_noise_lora"] = "lorabind-tiny/missing.safetensors"
        return prompt, False
    return prompt, True


def test_two_hundred_prompts_from_eight_threads_lose_none(models_root, tmp_path):
    server = _server(models_root, tmp_path, 4)

    async def user(number: int) -> list:
        client = Client(server.url, client_id=f"load-{number}")
        await client.connect()
        outcomes = []
        try:
            queued = []
            for index in range(number, 200, 8):
                prompt, valid = _mixed(index)
                status, body = await client.post("/prompt", {"prompt": prompt, "client_id": client.client_id})
                assert (status == 200) == valid, (index, status, body)
                if status == 200:
                    queued.append(body["prompt_id"])
                outcomes.append(status)
            for pid in queued:
                seen = await client.wait_done(pid, timeout=900)
                assert seen[-2]["type"] == "execution_success", seen[-2]
                _, history = await client.get(f"/history/{pid}")
                assert history[pid]["status"]["status_str"] == "success"
        finally:
            await client.close()
        return outcomes

    try:  # eight threads, each its own client and event loop
        results = on_threads([lambda n=n: run_async(user, n) for n in range(8)])
        assert [error for _, error in results] == [None] * 8
        outcomes = [status for statuses, _ in results for status in statuses]
        queue = run_async(_queue, server.url)
    finally:
        server.stop()
    assert len(outcomes) == 200 and outcomes.count(200) == 160 and outcomes.count(400) == 40
    assert queue == {"queue_running": [], "queue_pending": [], "lorabind_background": None}


async def _queue(url: str) -> dict:
    client = Client(url)
    try:
        _, queue = await client.get("/queue")
        return queue
    finally:
        await client.close()
