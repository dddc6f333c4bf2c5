"""``lorabind serve --ray``: a local Ray cluster on loopback with 2 CPU replicas behind the same API.

Checked the way a third-party client sees it (/prompt -> /ws events -> /history -> /view), plus what the
scale-out adds: prompts land where their LoRA set is already fused (fuse counts per replica), an interrupt
reaches the replica running the prompt, and a replica killed mid-run ends that prompt with a clear error while
the next prompts still run. Skips when the ``ray`` extra is not installed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from optional_extras import deferred, requires
from server_client import Client, run_async

openai = deferred("openai")
pytestmark = [requires("ray"), requires("openai"), pytest.mark.slow]  # runs whole workflows / servers end to end

WORKFLOW = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_lightx2v_4step.api.json"


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    from lorabind.tiny_models import build_tiny, lora_fixtures

    root = tmp_path_factory.mktemp("scale_out")
    build_tiny(root / "models", names=["tiny-wan22-t2v"])
    lora_fixtures.write_fixture_loras(root / "models")
    config = ServerConfig(port=0, models_root=str(root / "models"), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), ray_address="local",
                          replicas=2, openai_models=(("wan-4step", str(WORKFLOW)),
                                                     ("wan-base", str(WORKFLOW.with_name("wan22_tiny_t2v.api.json")))))
    srv = BackgroundServer(config).start(timeout=300)
    yield srv
    srv.stop(timeout=120)


def _prompt(strength: float, seed: int, *, steps: int = 4) -> dict:
    """The lightx2v pair example with the high-noise strength naming the LoRA set; ``steps`` > 4 overrides
    the contract (a long run to interrupt or kill)."""
    prompt = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    pair = next(n for n in prompt.values() if n["class_type"] == "WanMoELoRAPair")
    sampler = next(n for n in prompt.values() if n["class_type"] == "LoraBindSampler")
    pair["inputs"]["high_noise_strength"] = strength
    sampler["inputs"].update(seed=seed, steps=steps, enforce_contract=steps == 4)
    return copy.deepcopy(prompt)


async def _routing(client: Client) -> dict:
    status, body = await client.get("/lorabind/routing")
    assert status == 200
    return body


async def _wait_for(client: Client, prompt_id: str, kind: str) -> dict:
    while True:
        message = await client.receive(timeout=300)
        if message["type"] == kind and message["data"].get("prompt_id") == prompt_id:
            return message


def test_prompts_end_to_end_and_fused_once_per_replica(ray_server):
    async def body():
        client = Client(ray_server.url, client_id="third-party")
        try:
            await client.connect()
            # Two LoRA sets alternating over 8 prompts, each run to completion before the next.
            for i in range(8):
                previews = len(client.binary)
                prompt_id = (await client.queue_prompt(_prompt(1.0 if i % 2 == 0 else 0.5, seed=i)))["prompt_id"]
                seen = await client.wait_done(prompt_id, timeout=300)
                assert len(client.binary) - previews >= 2  # the replica's live previews: the first and last step
                kinds = [m["type"] for m in seen]
                assert kinds[0] == "execution_start" and kinds[-2:] == ["execution_success", "executing"], kinds
                executed = [m["data"] for m in seen if m["type"] == "executed" and "images" in m["data"]["output"]]
                image = executed[-1]["output"]["images"][0]
                status, history = await client.get(f"/history/{prompt_id}")
                assert history[prompt_id]["status"]["status_str"] == "success"
                saved = next(o for o in history[prompt_id]["outputs"].values() if "images" in o)["images"][0]
                assert saved == image  # the history names the file as the event did: in the front's folder
                status, data = await client.get("/view", params={k: image[k] for k in ("filename", "subfolder",
                                                                                         "type")})
                assert status == 200 and data[:4] == b"RIFF"  # an animated WebP, served by the front
            routing = await _routing(client)
            replicas = routing["replicas"]
            assert sum(r["prompts"] for r in replicas.values()) == 8
            # Each LoRA set is fused once per replica it lands on, never per prompt.
            for name, replica in replicas.items():
                assert replica["fuses"] == len(replica["fingerprints"]), (name, replica)
            assert sum(r["fuses"] for r in replicas.values()) == 2
            # Eight different files in the front's output folder, although each replica counts from 00001.
            status, history = await client.get("/history")
            names = {o["images"][0]["filename"] for entry in history.values() for o in entry["outputs"].values()
                     if "images" in o}
            assert len(names) == 8
        finally:
            await client.close()

    run_async(body)


def test_the_same_prompt_twice_returns_its_own_bytes_both_times(ray_server):
    """Issue 60, item 1: the second answer comes from the replica's output cache. On main it named the first
    run's file, which the replica had deleted after carrying it, so the front answered with whatever it held under
    that name: here the file of the prompt queued between the two (same binding, so the same replica)."""
    async def body():
        client = Client(ray_server.url, client_id="same-twice")
        try:
            await client.connect()
            other = await client.run_and_view(_prompt(1.0, seed=301))
            first = await client.run_and_view(_prompt(1.0, seed=302))
            second = await client.run_and_view(_prompt(1.0, seed=302))
            assert [data for _, data in first] != [data for _, data in other]  # two seeds: a wrong answer shows
            assert [data for _, data in second] == [data for _, data in first]  # its own bytes
            assert not {name for name, _ in second} & {name for name, _ in first}  # under names of its own
        finally:
            await client.close()

    run_async(body)


def test_the_chat_endpoint_runs_on_the_replicas_routed_by_binding(ray_server):
    """Two served templates bind different LoRA sets: their chat requests queue like any prompt, so each set
    lands on one replica (the affinity routing), and the answers carry the videos the replicas made."""
    async def body():
        client = Client(ray_server.url, client_id="openai-routing")
        api = openai.AsyncOpenAI(base_url=ray_server.url + "/v1", api_key="unused", timeout=300)
        try:
            before = (await _routing(client))["replicas"]
            # one after the other, each binding's two back to back: a replica holds one multiplexed binding, so
            # interleaved bindings evict each other and Ray then places the next request on any replica (timing,
            # not our routing)
            answers = [await api.chat.completions.create(model=model, messages=[{"role": "user", "content": "a fox"}],
                                                         extra_body={"seed": seed})
                       for seed, model in enumerate(["wan-4step", "wan-4step", "wan-base", "wan-base"])]
            for answer in answers:
                status, data = await client.get(answer.choices[0].message.content[0]["video_url"]["url"]
                                                .replace(ray_server.url, ""))
                assert status == 200 and data[:4] == b"RIFF"
            after = (await _routing(client))["replicas"]
            added: dict = {}  # fingerprint -> {replica: prompts added by this test}
            for replica, stats in after.items():
                for fingerprint, count in stats["fingerprints"].items():
                    old = before.get(replica, {}).get("fingerprints", {}).get(fingerprint, 0)
                    if count > old:
                        added.setdefault(fingerprint, {})[replica] = count - old
            assert sorted(len(replicas) for replicas in added.values()) == [1, 1], added
            assert sorted(sum(replicas.values()) for replicas in added.values()) == [2, 2], added
        finally:
            await api.close()
            await client.close()

    run_async(body)


def test_interrupt_reaches_the_replica_running_the_prompt(ray_server):
    async def body():
        client = Client(ray_server.url, client_id="interrupter")
        try:
            await client.connect()
            prompt_id = (await client.queue_prompt(_prompt(1.0, seed=100, steps=200)))["prompt_id"]
            await _wait_for(client, prompt_id, "progress")
            running = (await _routing(client))["running"]
            assert prompt_id in running
            status, _ = await client.post("/interrupt", {"prompt_id": prompt_id})
            assert status == 200
            seen = await client.wait_done(prompt_id, timeout=300)
            kinds = [m["type"] for m in seen]
            assert "execution_interrupted" in kinds and "execution_success" not in kinds
            steps = [m["data"]["value"] for m in seen if m["type"] == "progress"]
            assert max(steps, default=0) < 200  # stopped mid-run on the replica, not after it
        finally:
            await client.close()

    run_async(body)


def test_replica_killed_mid_run_fails_that_prompt_clearly_and_the_next_runs(ray_server):
    import ray

    async def body():
        client = Client(ray_server.url, client_id="survivor")
        try:
            await client.connect()
            prompt_id = (await client.queue_prompt(_prompt(0.5, seed=200, steps=400)))["prompt_id"]
            await _wait_for(client, prompt_id, "progress")
            replica = (await _routing(client))["running"][prompt_id]
            ray.kill(ray.get_actor(replica, namespace="serve"), no_restart=False)
            seen = await client.wait_done(prompt_id, timeout=300)  # the history is written by now
            error = next(m["data"] for m in seen if m["type"] == "execution_error")
            assert replica in error["exception_message"] and "did not finish" in error["exception_message"]
            assert error["exception_type"] == "ReplicaLostError"
            status, history = await client.get(f"/history/{prompt_id}")
            assert history[prompt_id]["status"]["status_str"] == "error"
            assert (await _routing(client))["replicas_lost_mid_prompt"] == [
                {"replica": replica, "prompt_id": prompt_id}]
            # The next prompt runs (on the surviving replica, or on the one Ray restarted).
            next_id = (await client.queue_prompt(_prompt(1.0, seed=201)))["prompt_id"]
            seen = await client.wait_done(next_id, timeout=300)
            assert [m["type"] for m in seen][-2] == "execution_success"
        finally:
            await client.close()

    run_async(body)
