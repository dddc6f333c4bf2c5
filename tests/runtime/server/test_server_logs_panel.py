"""The editor's Logs panel (issue 30): ``/internal/logs/raw`` answers with the server's own log lines, so the
frontend no longer says "please ensure you have updated your ComfyUI backend", and a client that subscribes gets
new lines over its WebSocket as ``logs`` messages."""

from __future__ import annotations

import asyncio

from server_client import Client, run_async
from server_fake_nodes import count_and_save


def test_logs_panel_gets_the_server_lines_and_follows_new_ones(server):
    async def body():
        client = Client(server.url, client_id="logs-client")
        try:
            await client.connect()
            done = (await client.queue_prompt(count_and_save(1)))["prompt_id"]
            await client.wait_done(done)
            status, raw = await client.get("/internal/logs/raw")
            assert status == 200 and set(raw) == {"entries", "size"}
            lines = "".join(entry["m"] for entry in raw["entries"])
            assert f"prompt {done}" in lines and all(entry["m"].endswith("\n") for entry in raw["entries"])

            async with client.session.patch(server.url + "/internal/logs/subscribe",
                                            json={"enabled": True, "clientId": "logs-client"}) as reply:
                assert reply.status == 200
            second = (await client.queue_prompt({"1": {"class_type": "SrvFail", "inputs": {"value": 2}}}))["prompt_id"]
            await client.wait_done(second)
            deadline = asyncio.get_running_loop().time() + 30
            while not any(m["type"] == "logs" and second in "".join(e["m"] for e in m["data"]["entries"])
                          for m in client.messages):
                assert asyncio.get_running_loop().time() < deadline, client.messages
                await client.receive()
            async with client.session.patch(server.url + "/internal/logs/subscribe",
                                            json={"enabled": True}) as reply:
                assert reply.status == 400 and "clientId" in await reply.text()
        finally:
            await client.close()

    run_async(body)
