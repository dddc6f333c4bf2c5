"""``serve --ray --max-batch 3`` (issue 53): each replica runs the step engine. Three prompts over one distill pair,
two of them with a style LoRA of their own, share one fingerprint (only the part a replica holds fused counts), so
they reach one replica, which batches them; each equals the same prompt served one at a time in this process
(PNG frames, within one 8-bit level). A local Ray cluster on loopback; skips without the ``ray`` extra."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from optional_extras import requires
from server_client import Client, run_async
from serving_helpers import frames_of, styled_prompt, write_styles

pytestmark = [requires("ray"), pytest.mark.slow]

PROMPTS = [(1, "a cat dancing", 51), (2, "a red fox", None), (3, "a lighthouse", 61)]


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    from lorabind.tiny_models import build_tiny, lora_fixtures

    root = tmp_path_factory.mktemp("ray_batched") / "models"
    build_tiny(root, names=["tiny-wan22-t2v"])
    lora_fixtures.write_fixture_loras(root)
    write_styles(root)
    return root


def _serve(models_root, tmp, **options) -> BackgroundServer:
    config = ServerConfig(port=0, models_root=str(models_root), output_dir=str(tmp / "output"),
                          input_dir=str(tmp / "input"), temp_dir=str(tmp / "temp"), **options)
    return BackgroundServer(config).start(timeout=300)


async def _all_at_once(url: str) -> tuple:
    clients = [Client(url, client_id=f"ray-user-{i}") for i in range(len(PROMPTS))]
    try:
        for client in clients:
            await client.connect()
        results = await asyncio.gather(*(frames_of(c, styled_prompt(*p)) for c, p in zip(clients, PROMPTS)))
        _, routing = await clients[0].get("/lorabind/routing")
        return results, routing
    finally:
        for client in clients:
            await client.close()


def test_mixed_lora_prompts_reach_one_replica_and_share_its_batches(models_root, tmp_path):
    local = _serve(models_root, tmp_path / "local")
    try:
        async def one_by_one():
            client = Client(local.url)
            await client.connect()
            try:
                return [await frames_of(client, styled_prompt(*p)) for p in PROMPTS]
            finally:
                await client.close()
        alone = run_async(one_by_one)
    finally:
        local.stop()
    ray = _serve(models_root, tmp_path / "ray", ray_address="local", replicas=2, max_batch=3)
    try:
        results, routing = run_async(_all_at_once, ray.url)
    finally:
        ray.stop(timeout=120)
    for (frames, _, _), (want, _, _) in zip(results, alone):
        assert frames is not None and int(np.abs(frames - want).max()) <= 1
    busy = [name for name, replica in routing["replicas"].items() if replica["prompts"]]
    assert len(busy) == 1  # one fingerprint: the pair; the style LoRAs run on their prompts' rows
    assert max(report["batching"]["largest_batch"] for _, report, _ in results) >= 2
