"""Issue 31, the user's storage: settings read and written under one rule, user files under quotas with a real
``overwrite=false``, and refusals that are 400s naming the name, not 500s carrying the state folder's path."""

from __future__ import annotations

import asyncio
import json

from lorabind.runtime.server.comfy_api import routes_settings, user_files
from server_client import Client, run_async, user_folder


def _nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_setting_the_reader_would_refuse_is_refused_on_write(server):
    async def body():
        client = Client(server.url)
        try:
            assert (await client.request("POST", "/api/settings", {"Comfy.Locale": "en"}))[0] == 200
            status, reply, _ = await client.request("POST", "/api/settings/deep", _nested(100))
            assert status == 400 and "would not be readable" in reply["error"]["message"], reply
            assert (await client.get("/api/settings"))[1] == {"Comfy.Locale": "en"}
        finally:
            await client.close()

    run_async(body)


def test_damaged_settings_are_an_error_and_are_never_overwritten(server):
    async def body():
        client = Client(server.url)
        try:
            status, reply = await client.get("/api/settings")
            assert status == 500 and "comfy.settings.json" in reply["error"]["message"]
            assert server.config.state_dir not in json.dumps(reply)
            assert (await client.get("/api/settings/Comfy.Locale"))[0] == 500
            status, _, _ = await client.request("POST", "/api/settings", {"Comfy.Locale": "fr"})
            assert status == 500
        finally:
            await client.close()

    stored = user_folder(server) / routes_settings.SETTINGS_FILE
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text('{"Comfy.Locale": "en", "broken', encoding="utf-8")
    run_async(body)
    assert stored.read_text(encoding="utf-8") == '{"Comfy.Locale": "en", "broken'


def test_settings_cannot_grow_past_the_size_the_reader_accepts(server, monkeypatch):
    monkeypatch.setattr(routes_settings, "MAX_SETTINGS_BYTES", 2000)

    async def body():
        client = Client(server.url)
        try:
            answers = [(await client.request("POST", f"/api/settings/k{n}", json.dumps("v" * 900)))[0]
                       for n in range(3)]
            assert answers == [200, 200, 413]
            assert set((await client.get("/api/settings"))[1]) == {"k0", "k1"}
        finally:
            await client.close()

    run_async(body)
    assert (user_folder(server) / routes_settings.SETTINGS_FILE).stat().st_size <= 2000


def test_overwrite_false_is_checked_when_the_body_has_arrived(server):
    arrived = asyncio.Event()

    async def slow_body():
        yield b'{"writer": '
        await arrived.wait()  # the other writer creates the file meanwhile
        yield b'"slow"}'

    async def slow_writer(client: Client) -> int:
        url = client.base_url + "/api/userdata/workflows%2Frace.json?overwrite=false"
        async with client.session.post(url, data=slow_body()) as slow:
            return slow.status

    async def body():
        client = Client(server.url)
        try:
            slow = asyncio.ensure_future(slow_writer(client))
            await asyncio.sleep(0.5)  # its handler has started
            status, _, _ = await client.request("POST", "/api/userdata/workflows%2Frace.json?overwrite=false",
                                       {"writer": "fast"})
            assert status == 200
            arrived.set()
            assert await asyncio.wait_for(slow, 10) == 409
        finally:
            await client.close()

    run_async(body)
    assert json.loads((user_folder(server) / "workflows/race.json").read_text()) == {"writer": "fast"}


def test_user_files_have_count_and_size_quotas_and_listings_are_never_cut(server, monkeypatch):
    monkeypatch.setattr(user_files, "MAX_USER_FILES", 3)
    monkeypatch.setattr(user_files, "MAX_USER_BYTES", 1000)

    async def body():
        client = Client(server.url)
        try:
            saves = [(await client.request("POST", f"/api/userdata/workflows%2F{n}.json", "x" * 200))[0]
                     for n in range(4)]
            assert saves == [200, 200, 200, 413]
            assert (await client.request("POST", "/api/userdata/workflows%2F0.json", "y" * 300))[0] == 200
            status, reply, _ = await client.request("POST", "/api/userdata/workflows%2F1.json", "z" * 700)
            assert status == 413 and "1000 bytes" in reply["error"]["message"]
            for n in range(4, 6):  # placed by hand, past the quota
                (user_folder(server) / f"workflows/{n}.json").write_text("{}")
            status, reply, _ = await client.request("GET", "/api/userdata?dir=workflows")
            assert status == 413 and "more than 3 files" in reply["error"]["message"]
        finally:
            await client.close()

    run_async(body)


def test_impossible_names_are_400s_without_the_state_path(server):
    async def body():
        client = Client(server.url)
        try:
            long_part = "workflows%2F" + "a" * 256 + ".json"
            assert (await client.request("POST", "/api/userdata/workflows%2Fa.json", {}))[0] == 200
            answers = [await client.request("POST", f"/api/userdata/{name}", {})
                       for name in (long_part, "workflows%2Fa.json%2Fb.json")]
            answers.append(await client.request("POST", "/api/userdata/workflows%2Fa.json/move/"
                                          "workflows%2Fa.json%2Fc.json"))
            for status, reply, _ in answers:
                assert status == 400, reply
                assert server.config.state_dir not in json.dumps(reply)
            assert "longer than 255 bytes" in answers[0][1]["error"]["message"]
            assert "'workflows/a.json' is a file" in answers[1][1]["error"]["message"]
        finally:
            await client.close()

    run_async(body)
