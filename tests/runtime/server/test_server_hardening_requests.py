"""Issue 31, the request side: JSON bodies within budgets and parsed off the event loop, prompt and client ids,
the WebSocket's client id registration, and history bounded in bytes."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest

from lorabind.loaders.io import json_limits
from lorabind.runtime.server.comfy_api import routes_prompt
from lorabind.runtime.server.history import HistoryStore
from server_client import Client, run_async
from server_fake_nodes import count_and_save


def _entry(n: int, padding: int = 0) -> dict:
    return {"prompt": [n, f"p{n}", {}, {"pad": "x" * padding}, []], "outputs": {},
            "status": {"status_str": "success", "completed": True, "messages": []}, "meta": {}}


def test_a_body_over_the_value_budget_is_refused_before_it_is_parsed(server, monkeypatch):
    parsed = []
    real_loads = json_limits.loads
    monkeypatch.setattr(json_limits, "loads", lambda raw, **kw: parsed.append(len(raw)) or real_loads(raw, **kw))
    many = b'{"prompt": {}, "extra_data": {"junk": [' + b",".join([b"{}"] * json_limits.MAX_JSON_VALUES) + b"]}}"

    async def body():
        client = Client(server.url)
        try:
            status, reply = await client.post("/prompt", many)
            assert status == 413, reply
            assert f"more than {json_limits.MAX_JSON_VALUES} JSON values" in reply["error"]["message"]
            assert parsed == []  # refused on the count, never handed to the parser
            assert (await client.get("/queue"))[0] == 200
        finally:
            await client.close()

    run_async(body)


def test_request_json_is_parsed_off_the_event_loop(server, monkeypatch):
    threads = []
    real_loads = json_limits.loads
    monkeypatch.setattr(json_limits, "loads",
                        lambda raw, **kw: threads.append(threading.current_thread().name) or real_loads(raw, **kw))

    async def body():
        client = Client(server.url)
        try:
            assert (await client.post("/queue", {"clear": True}))[0] == 200
        finally:
            await client.close()

    run_async(body)
    assert threads and "lorabind-server" not in threads  # the event loop's thread (in_process_server)


def test_a_client_cannot_reuse_or_forge_prompt_ids(server, caplog):
    caplog.set_level(logging.INFO, logger="lorabind.server")

    async def body():
        client, other = Client(server.url), Client(server.url, "client-b")
        try:
            await client.connect()
            first = await client.queue_prompt(count_and_save(steps=1), prompt_id="4f0c2c1e-5d47-4d8e-9a55-0c0e1d2b3a4f")
            await client.wait_done(first["prompt_id"])
            _, before = await client.get(f"/history/{first['prompt_id']}")
            busy = (await client.queue_prompt(count_and_save(steps=300, delay=0.01)))["prompt_id"]
            for reused in (first["prompt_id"], busy):  # in the history, and running
                status, reply = await other.post("/prompt", {"prompt": count_and_save(steps=1), "prompt_id": reused})
                assert status == 400 and "already in use" in reply["error"]["message"], reply
            for forged in ("x\n12:00:00 prompt forged finished", "a b", "../x", "é", "a" * 129, ["x"], 7):
                status, reply = await other.post("/prompt", {"prompt": count_and_save(steps=1), "prompt_id": forged})
                assert status == 400 and "Field 'prompt_id' must be" in reply["error"]["message"], forged
            status, reply = await other.post("/prompt", {"prompt": count_and_save(steps=1),
                                                         "client_id": "me\n12:00:00 prompt forged finished"})
            assert status == 400 and "Field 'client_id' must be" in reply["error"]["message"]
            await client.post("/interrupt", {})
            await client.wait_done(busy)
            assert (await client.get(f"/history/{first['prompt_id']}"))[1] == before
        finally:
            await client.close()
            await other.close()

    run_async(body)
    assert not any("forged" in record.getMessage() for record in caplog.records)


def test_a_second_connection_gets_a_client_id_only_with_its_token(server):
    async def body():
        victim, spy, later = Client(server.url, "victim"), Client(server.url, "victim"), Client(server.url, "victim")
        try:
            token = (await victim.connect())["data"]["client_token"]
            spied = await spy.connect()  # a ComfyUI client ignoring tokens: given its own id, which it adopts
            assert spied["data"]["sid"] != "victim" and spied["data"]["client_token"] != token
            pid = (await victim.queue_prompt(count_and_save(steps=2)))["prompt_id"]
            assert "execution_success" in [m["type"] for m in await victim.wait_done(pid)]
            with pytest.raises(asyncio.TimeoutError):
                while True:  # status broadcasts only: none of the victim's execution messages
                    assert (await spy.receive(timeout=1.0))["type"] == "status"
            busy = (await victim.queue_prompt(count_and_save(steps=300, delay=0.01)))["prompt_id"]
            await victim.ws.close()  # gone, but its prompt runs: the id stays its own
            await spy.ws.close()
            assert (await spy.connect())["data"]["sid"] != "victim"
            assert (await spy.connect(token=token))["data"]["sid"] == "victim"  # the owner, back with its token
            await spy.post("/interrupt", {})
            assert "execution_interrupted" in [m["type"] for m in await spy.wait_done(busy)]
            await spy.ws.close()
            await asyncio.sleep(0.2)  # the server has seen the close
            # the owner is gone and its prompts are done: the id is free again (a script reusing a fixed id)
            assert (await later.connect())["data"]["sid"] == "victim"
        finally:
            for client in (victim, spy, later):
                await client.close()

    run_async(body)


def test_extra_data_is_bounded_in_bytes(server):
    async def body():
        client = Client(server.url)
        try:
            big = {"extra_pnginfo": {"workflow": "x" * (routes_prompt.MAX_EXTRA_DATA_BYTES + 1)}}
            status, reply = await client.post("/prompt", {"prompt": count_and_save(steps=1), "extra_data": big})
            assert status == 413 and "Field 'extra_data'" in reply["error"]["message"]
            assert (await client.get("/queue"))[1]["queue_pending"] == []
        finally:
            await client.close()

    run_async(body)


def test_history_is_bounded_in_bytes_keeping_the_newest(tmp_path):
    folder = tmp_path / "history"
    store = HistoryStore(folder, max_bytes=10_000)
    for n in range(5):
        store.add(f"p{n}", _entry(n, padding=3000))
    assert list(store.list()) == ["p2", "p3", "p4"]
    assert len(list(folder.glob("*.json"))) == 3
    store.add("huge", _entry(9, padding=50_000))  # over the budget alone: kept, everything older dropped
    assert list(store.list()) == ["huge"]
    assert list(HistoryStore(folder, max_bytes=10_000).list()) == ["huge"]
    assert json.loads(next(folder.glob("*.json")).read_text())["prompt_id"] == "huge"


def test_a_large_websocket_message_closes_only_that_socket(server):
    async def body():
        client, other = Client(server.url, "big-talker"), Client(server.url, "bystander")
        try:
            await client.connect()
            await other.connect()
            await client.ws.send_str("[" + ",".join(["{}"] * 100_000) + "]")  # 300 KB of small objects
            closing = await client.ws.receive(timeout=10)
            assert closing.type.name in ("CLOSE", "CLOSED", "CLOSING") and client.ws.close_code == 1009
            pid = (await other.queue_prompt(count_and_save(steps=1)))["prompt_id"]
            assert "execution_success" in [m["type"] for m in await other.wait_done(pid)]
        finally:
            await client.close()
            await other.close()

    run_async(body)


def test_openai_requests_take_only_well_formed_client_ids():
    from lorabind.runtime.server.openai.errors import OpenAIRequestError
    from lorabind.runtime.server.openai.requests import _request

    for forged in ("me\n12:00:00 prompt forged finished", 7):
        with pytest.raises(OpenAIRequestError, match="client_id: expected the WebSocket clientId, 1 to 128"):
            _request(None, {"client_id": forged})
