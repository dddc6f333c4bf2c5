"""Prompt submission over real HTTP + WebSocket: message sequence, history, /view, queue and interrupt."""

from __future__ import annotations

import asyncio

from server_client import Client, run_async
from server_fake_nodes import count_and_save


def test_prompt_runs_with_comfyui_message_sequence(server):
    async def body():
        client = Client(server.url)
        try:
            hello = await client.connect()
            token = hello["data"]["client_token"]
            assert isinstance(token, str) and len(token) >= 32
            assert hello == {"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}},
                                                        "sid": "client-a", "client_token": token}}
            queued = await client.queue_prompt(count_and_save(steps=3))
            assert set(queued) == {"prompt_id", "number", "node_errors"} and queued["node_errors"] == {}
            pid = queued["prompt_id"]
            seen = await client.wait_done(pid)
            types = [m["type"] for m in seen]
            assert types == ["execution_start", "execution_cached", "executing", "progress", "progress", "progress",
                             "executing", "executed", "execution_success", "executing"]
            start, cached, success = seen[0]["data"], seen[1]["data"], seen[-2]["data"]
            assert set(start) == {"prompt_id", "timestamp"} and isinstance(start["timestamp"], int)
            assert cached == {"nodes": [], "prompt_id": pid, "timestamp": cached["timestamp"]}
            assert set(success) == {"prompt_id", "timestamp"} and success["prompt_id"] == pid
            assert seen[2]["data"] == {"node": "1", "display_node": "1", "prompt_id": pid}
            assert [m["data"]["node"] for m in seen if m["type"] == "executing"] == ["1", "2", None]
            progress = [(m["data"]["value"], m["data"]["max"], m["data"]["node"]) for m in seen
                        if m["type"] == "progress"]
            assert progress == [(1, 3, "1"), (2, 3, "1"), (3, 3, "1")]
            executed = [m["data"] for m in seen if m["type"] == "executed"]
            assert len(executed) == 1 and executed[0]["node"] == "2"
            image = executed[0]["output"]["images"][0]
            assert image == {"filename": "srv_00003.png", "subfolder": "", "type": "output"}
            assert seen[-1] == {"type": "executing", "data": {"node": None, "prompt_id": pid}}

            status, history = await client.get(f"/history/{pid}")
            entry = history[pid]
            assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
            assert [m[0] for m in entry["status"]["messages"]][0] == "execution_start"
            assert entry["prompt"][1] == pid and entry["prompt"][4] == ["2"]
            assert entry["prompt"][3]["client_id"] == "client-a"
            assert entry["outputs"]["2"]["images"] == [image]
            assert entry["meta"]["2"]["node_id"] == "2"

            status, png = await client.get("/view", params=image)
            assert status == 200 and png[:8] == b"\x89PNG\r\n\x1a\n"
            from io import BytesIO

            from PIL import Image

            assert Image.open(BytesIO(png)).size == (4, 2)
            status, api_png = await client.get("/api/view", params=image)
            assert api_png == png
            status, webp = await client.get("/view", params={**image, "preview": "webp;50"})
            assert status == 200 and webp[:4] == b"RIFF" and Image.open(BytesIO(webp)).size == (4, 2)
            status, alpha = await client.get("/view", params={**image, "channel": "a"})
            assert Image.open(BytesIO(alpha)).mode == "L"
            assert set(Image.open(BytesIO(alpha)).getdata()) == {255}
            status, annotated = await client.get("/view", params={"filename": f"{image['filename']} [output]"})
            assert status == 200 and annotated == png
        finally:
            await client.close()

    run_async(body)


def test_resubmission_replays_cached_nodes_and_a_change_reruns_only_downstream(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            first = await client.wait_done((await client.queue_prompt(count_and_save(steps=2)))["prompt_id"])
            first_output = next(m["data"]["output"] for m in first if m["type"] == "executed")
            pid = (await client.queue_prompt(count_and_save(steps=2)))["prompt_id"]
            seen = await client.wait_done(pid)
            # everything cached: no `executing` for any node, the output node's ui is replayed
            assert [m["type"] for m in seen] == ["execution_start", "execution_cached", "executed",
                                                 "execution_success", "executing"]
            assert seen[1]["data"]["nodes"] == ["1", "2"]
            assert seen[2]["data"] == {"node": "2", "display_node": "2", "output": first_output, "prompt_id": pid}
            _, history = await client.get(f"/history/{pid}")
            assert history[pid]["outputs"]["2"] == first_output

            pid = (await client.queue_prompt(count_and_save(steps=2, prefix="other")))["prompt_id"]
            seen = await client.wait_done(pid)
            assert seen[1]["data"]["nodes"] == ["1"]
            assert [m["data"]["node"] for m in seen if m["type"] == "executing"] == ["2", None]
            assert "progress" not in [m["type"] for m in seen]
        finally:
            await client.close()

    run_async(body)


def test_execution_error_reaches_client_and_history(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            prompt = {"1": {"class_type": "SrvFail", "inputs": {"value": 7}}}
            pid = (await client.queue_prompt(prompt))["prompt_id"]
            seen = await client.wait_done(pid)
            errors = [m["data"] for m in seen if m["type"] == "execution_error"]
            assert len(errors) == 1
            assert errors[0]["node_id"] == "1" and errors[0]["node_type"] == "SrvFail"
            assert "SrvFail refuses value 7" in errors[0]["exception_message"]
            assert "execution_success" not in [m["type"] for m in seen]
            _, history = await client.get(f"/history/{pid}")
            status = history[pid]["status"]
            assert status["status_str"] == "error" and status["completed"] is False
            assert status["messages"][-1][0] == "execution_error"
        finally:
            await client.close()

    run_async(body)


def test_interrupt_stops_a_running_node_between_steps(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            pid = (await client.queue_prompt(count_and_save(steps=400, delay=0.01)))["prompt_id"]
            while True:  # wait until the node is really looping
                message = await client.receive()
                if message["type"] == "progress" and message["data"]["value"] >= 2:
                    break
            status, _ = await client.post("/interrupt", {"prompt_id": "someone-else"})
            assert status == 200
            status, _ = await client.post("/interrupt", {"prompt_id": pid})
            assert status == 200
            seen = await client.wait_done(pid)
            interrupted = [m["data"] for m in seen if m["type"] == "execution_interrupted"]
            assert len(interrupted) == 1 and interrupted[0]["node_id"] == "1"
            steps_done = max(m["data"]["value"] for m in client.messages if m["type"] == "progress")
            assert 2 <= steps_done < 400
            _, history = await client.get(f"/history/{pid}")
            assert history[pid]["status"]["completed"] is False and history[pid]["outputs"] == {}
            # the worker is healthy: the next prompt runs to the end
            pid2 = (await client.queue_prompt(count_and_save(steps=2)))["prompt_id"]
            assert "execution_success" in [m["type"] for m in await client.wait_done(pid2)]
        finally:
            await client.close()

    run_async(body)


def test_queue_order_front_delete_and_clear(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            running = (await client.queue_prompt(count_and_save(steps=2000, delay=0.01)))["prompt_id"]
            while (await client.receive())["type"] != "progress":
                pass
            queued = [(await client.queue_prompt(count_and_save(steps=1, prefix=p)))["prompt_id"] for p in "abc"]
            front = (await client.queue_prompt(count_and_save(steps=1, prefix="f"), front=True))["prompt_id"]
            status, queue = await client.get("/queue")
            assert [item[1] for item in queue["queue_running"]] == [running]
            assert [item[1] for item in queue["queue_pending"]] == [front] + queued
            assert len(queue["queue_pending"][0]) == 5 and queue["queue_pending"][0][0] < 0
            _, prompt_info = await client.get("/prompt")
            assert prompt_info == {"exec_info": {"queue_remaining": 5}}

            assert (await client.post("/queue", {"delete": [queued[1]]}))[0] == 200
            _, queue = await client.get("/api/queue")
            assert [item[1] for item in queue["queue_pending"]] == [front, queued[0], queued[2]]
            assert (await client.post("/queue", {"clear": True}))[0] == 200
            _, queue = await client.get("/queue")
            assert queue["queue_pending"] == [] and [i[1] for i in queue["queue_running"]] == [running]

            await client.post("/interrupt", {})
            await client.wait_done(running)
            _, history = await client.get("/history")
            assert list(history) == [running]
        finally:
            await client.close()

    run_async(body)


def test_events_go_only_to_the_submitting_client_and_survive_disconnects(server):
    async def body():
        alice, bob = Client(server.url, "alice"), Client(server.url, "bob")
        try:
            await alice.connect()
            await bob.connect()
            # bob submits, then drops his socket while his prompt is still queued/running
            bob_pid = (await bob.queue_prompt(count_and_save(steps=20, delay=0.01, prefix="bob")))["prompt_id"]
            await bob.ws.close()
            alice_pid = (await alice.queue_prompt(count_and_save(steps=2, prefix="alice")))["prompt_id"]
            seen = await alice.wait_done(alice_pid)
            assert "execution_success" in [m["type"] for m in seen]
            foreign = [m for m in alice.messages if m["type"] != "status"
                       and m["data"].get("prompt_id") not in (None, alice_pid)]
            assert foreign == []
            remaining = [m["data"]["status"]["exec_info"]["queue_remaining"]
                         for m in alice.messages if m["type"] == "status"]
            # two prompts at most were ever waiting, and alice's finish left the queue empty
            assert set(remaining) <= {0, 1, 2} and remaining[-1] == 0
            _, history = await alice.get(f"/history/{bob_pid}")
            assert history[bob_pid]["status"]["status_str"] == "success"
            assert history[bob_pid]["outputs"]["2"]["images"][0]["filename"] == "bob_00020.png"
        finally:
            await alice.close()
            await bob.close()

    run_async(body)


def test_history_listing_delete_and_clear(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            pids = []
            for prefix in "xyz":
                pid = (await client.queue_prompt(count_and_save(steps=1, prefix=prefix)))["prompt_id"]
                await client.wait_done(pid)
                pids.append(pid)
            _, history = await client.get("/history")
            assert list(history) == pids
            _, last_two = await client.get("/history", params={"max_items": "2"})
            assert list(last_two) == pids[1:]
            _, unknown = await client.get("/history/not-a-prompt")
            assert unknown == {}
            await client.post("/history", {"delete": [pids[0]]})
            _, history = await client.get("/api/history")
            assert list(history) == pids[1:]
            await client.post("/history", {"clear": True})
            assert (await client.get("/history"))[1] == {}
        finally:
            await client.close()

    run_async(body)


def test_client_chosen_prompt_id_and_number(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            queued = await client.queue_prompt(count_and_save(steps=1), prompt_id="my-id-1", number=42)
            assert queued["prompt_id"] == "my-id-1" and queued["number"] == 42
            await client.wait_done("my-id-1")
            _, history = await client.get("/history/my-id-1")
            assert history["my-id-1"]["prompt"][0] == 42
        finally:
            await client.close()

    run_async(body)


def test_restart_keeps_history(tmp_path):
    from server_client import start_server

    async def run_one(url):
        client = Client(url)
        try:
            await client.connect()
            pid = (await client.queue_prompt(count_and_save(steps=1, prefix="keep")))["prompt_id"]
            await client.wait_done(pid)
            return pid
        finally:
            await client.close()

    async def fetch(url, path):
        client = Client(url)
        try:
            return (await client.get(path))[1]
        finally:
            await client.close()

    first = start_server(tmp_path)
    try:
        pid = asyncio.run(run_one(first.url))
    finally:
        first.stop()
    second = start_server(tmp_path)
    try:
        history = asyncio.run(fetch(second.url, f"/history/{pid}"))
        assert history[pid]["outputs"]["2"]["images"][0]["filename"] == "keep_00001.png"
        assert history[pid]["status"]["status_str"] == "success"
    finally:
        second.stop()


class _Pick:
    """Output node whose COMBO options can change while a prompt naming one waits in the queue."""

    OPTIONS = ["a", "b"]
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": (list(cls.OPTIONS),)}}

    def run(self, name):
        return {"ui": {"text": [name]}}


def test_prompt_invalid_by_the_time_it_runs_is_an_execution_error_not_a_dead_worker(tmp_path):
    from lorabind.runtime.server import BackgroundServer, ServerConfig
    from server_fake_nodes import FAKE_NODES

    config = ServerConfig(port=0, models_root=str(tmp_path / "m"), output_dir=str(tmp_path / "o"),
                          input_dir=str(tmp_path / "i"), temp_dir=str(tmp_path / "t"))
    srv = BackgroundServer(config, node_classes={**FAKE_NODES, "Pick": _Pick}).start()

    async def body():
        client = Client(srv.url)
        try:
            await client.connect()
            busy = (await client.queue_prompt(count_and_save(steps=2000, delay=0.01)))["prompt_id"]
            while (await client.receive())["type"] != "progress":
                pass
            pid = (await client.queue_prompt({"1": {"class_type": "Pick", "inputs": {"name": "a"}}}))["prompt_id"]
            _Pick.OPTIONS = ["b"]  # e.g. the LoRA file was deleted while the prompt waited
            await client.post("/interrupt", {"prompt_id": busy})
            seen = await client.wait_done(pid)
            error = next(m["data"] for m in seen if m["type"] == "execution_error")
            assert error["node_id"] is None and error["prompt_id"] == pid
            assert error["exception_type"].endswith("PromptValidationError")
            assert "name: 'a' not in ['b']" in error["exception_message"]
            _, history = await client.get(f"/history/{pid}")
            assert history[pid]["status"]["status_str"] == "error"
            _Pick.OPTIONS = ["a", "b"]
            again = (await client.queue_prompt({"1": {"class_type": "Pick", "inputs": {"name": "a"}}}))["prompt_id"]
            assert "execution_success" in [m["type"] for m in await client.wait_done(again)]
        finally:
            _Pick.OPTIONS = ["a", "b"]
            await client.close()

    try:
        run_async(body)
    finally:
        srv.stop()
