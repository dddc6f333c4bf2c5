"""The frontend's per-user storage (``/settings``, ``/users``, ``/userdata``): ComfyUI's shapes, kept across a
restart, and every path confined to ``<state folder>/userdata``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lorabind.runtime.server.comfy_api import routes_settings, routes_userdata
from server_client import Client, run_async, start_server, user_folder


def test_settings_are_merged_stored_and_read_back(server):
    async def body():
        client = Client(server.url)
        try:
            assert (await client.get("/api/settings")) == (200, {})
            assert (await client.get("/api/settings/Comfy.Locale"))[1] is None
            assert (await client.request("POST", "/api/settings", {"Comfy.Locale": "en", "A": 1}))[0] == 200
            assert (await client.request("POST", "/api/settings/Comfy.TutorialCompleted", True))[0] == 200
            assert (await client.request("POST", "/api/settings", {"A": 2}))[0] == 200
            _, settings = await client.get("/api/settings")
            assert settings == {"Comfy.Locale": "en", "A": 2, "Comfy.TutorialCompleted": True}
            assert (await client.get("/api/settings/A"))[1] == 2
            stored = json.loads((user_folder(server) / "comfy.settings.json").read_text())
            assert stored == settings
            status, error, _ = await client.request("POST", "/api/settings", [1, 2])
            assert status == 400 and "must be a JSON object" in error["error"]["message"]
            status, error, _ = await client.request("POST", "/api/settings/A", b"{nope")
            assert status == 400 and "not valid JSON" in error["error"]["message"]
            assert (await client.get("/api/users"))[1] == {"storage": "server", "migrated": True}
            status, refused, _ = await client.request("POST", "/api/users", {"username": "bob"})
            assert status == 400 and "single user" in refused["error"]
        finally:
            await client.close()

    run_async(body)


def test_settings_body_is_bounded(server, monkeypatch):
    monkeypatch.setattr(routes_settings, "MAX_SETTINGS_BYTES", 64)

    async def body():
        client = Client(server.url)
        try:
            status, _, _ = await client.request("POST", "/api/settings", {"x": "a" * 100})
            assert status == 413
            assert (await client.get("/api/settings"))[1] == {}
        finally:
            await client.close()

    run_async(body)


def test_workflow_save_list_load_rename_delete(server):
    workflow = {"nodes": [], "links": [], "extra": {"note": "héllo"}}

    async def body():
        client = Client(server.url)
        try:
            status, answer, _ = await client.request("GET", "/api/userdata?dir=workflows&recurse=true&full_info=true")
            assert status == 200 and answer == []  # the folder exists from the start: no 404 on a fresh server
            status, saved, _ = await client.request(
                "POST", "/api/userdata/workflows%2Fmine.json?overwrite=false&full_info=true", workflow)
            assert status == 200 and saved["path"] == "workflows/mine.json" and saved["size"] > 0
            assert isinstance(saved["modified"], int) and saved["modified"] > 1e12  # milliseconds, as ComfyUI
            status, _, _ = await client.request("POST", "/api/userdata/workflows%2Fmine.json?overwrite=false",
                                          workflow)
            assert status == 409
            await client.request("POST", "/api/userdata/workflows%2Fsub%2Fdeep.json", {"nodes": []})
            _, listed, _ = await client.request("GET", "/api/userdata?dir=workflows&recurse=true&full_info=true")
            assert sorted(item["path"] for item in listed) == ["mine.json", "sub/deep.json"]
            _, flat, _ = await client.request("GET", "/api/userdata?dir=workflows")
            assert flat == ["mine.json"]
            _, split, _ = await client.request("GET", "/api/userdata?dir=workflows&recurse=true&split=true")
            assert sorted(split) == [["mine.json", "mine.json"], ["sub/deep.json", "sub", "deep.json"]]
            status, loaded, headers = await client.request("GET", "/api/userdata/workflows%2Fmine.json")
            assert status == 200 and loaded == workflow
            assert headers["X-Content-Type-Options"] == "nosniff" and headers["Content-Disposition"] == "attachment"
            status, moved, _ = await client.request(
                "POST", "/api/userdata/workflows%2Fmine.json/move/workflows%2Frenamed.json?overwrite=false")
            assert status == 200 and moved == "workflows/renamed.json"
            assert (await client.get("/api/userdata/workflows%2Fmine.json"))[0] == 404
            assert (await client.request("POST", "/api/userdata/workflows%2Fsub%2Fdeep.json/move/"
                                   "workflows%2Frenamed.json?overwrite=false"))[0] == 409
            assert (await client.request("DELETE", "/api/userdata/workflows%2Frenamed.json"))[0] == 204
            assert (await client.request("DELETE", "/api/userdata/workflows%2Frenamed.json"))[0] == 404
            assert json.loads((user_folder(server) / "workflows/sub/deep.json").read_text()) == {"nodes": []}
        finally:
            await client.close()

    run_async(body)


def test_saved_workflows_survive_a_restart(tmp_path):
    first = start_server(tmp_path)
    try:
        async def save():
            client = Client(first.url)
            try:
                assert (await client.request("POST", "/api/userdata/workflows%2Fkept.json", {"k": 1}))[0] == 200
                assert (await client.request("POST", "/api/settings/Comfy.Locale", json.dumps("fr")))[0] == 200
            finally:
                await client.close()

        run_async(save)
    finally:
        first.stop()
    second = start_server(tmp_path)
    try:
        async def read():
            client = Client(second.url)
            try:
                _, listed, _ = await client.request("GET", "/api/userdata?dir=workflows&recurse=true")
                assert listed == ["kept.json"]
                assert (await client.get("/api/settings"))[1] == {"Comfy.Locale": "fr"}
            finally:
                await client.close()

        run_async(read)
    finally:
        second.stop()


@pytest.mark.parametrize("name", ["..%2Fhistory%2Fx.json", "workflows%2F..%2F..%2Fx.json", "%2Fetc%2Fpasswd",
                                  "workflows%5C..%5Cx.json", "C:%2Fx.json", "workflows%2F%2Fx.json",
                                  "a%00b.json", "workflows%2F.%2Fx.json"])
def test_user_paths_outside_the_user_folder_are_refused(server, name):
    async def body():
        client = Client(server.url)
        try:
            for method, path in (("POST", f"/api/userdata/{name}"), ("GET", f"/api/userdata/{name}"),
                                 ("DELETE", f"/api/userdata/{name}"),
                                 ("POST", f"/api/userdata/workflows%2Fok.json/move/{name}"),
                                 ("GET", f"/api/userdata?dir={name}")):
                if method == "POST" and "/move/" in path:
                    await client.request("POST", "/api/userdata/workflows%2Fok.json", b"{}")
                status, answer, _ = await client.request(method, path, b"{}" if method == "POST" else None)
                assert status in (400, 403, 404), (method, path, status)
                if status != 404 and isinstance(answer, dict):  # aiohttp itself refuses a NUL in the path
                    assert answer["error"]["type"] == "invalid_path", (method, path)
            state = Path(server.config.state_dir)
            assert not (state / "x.json").exists() and not (state / "history" / "x.json").exists()
            assert not (state.parent / "x.json").exists()
        finally:
            await client.close()

    run_async(body)


def test_symlink_out_of_the_user_folder_is_not_followed(server, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"secret": 1}')
    workflows = user_folder(server) / "workflows"
    workflows.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, workflows / "link")
    os.symlink(outside / "secret.json", workflows / "secret.json")

    async def body():
        client = Client(server.url)
        try:
            for path in ("/api/userdata/workflows%2Flink%2Fsecret.json", "/api/userdata/workflows%2Fsecret.json"):
                status, _, _ = await client.request("GET", path)
                assert status == 403
            status, _, _ = await client.request("POST", "/api/userdata/workflows%2Flink%2Fnew.json", b"{}")
            assert status == 403 and not (outside / "new.json").exists()
            _, listed, _ = await client.request("GET", "/api/userdata?dir=workflows&recurse=true")
            assert listed == []
        finally:
            await client.close()

    run_async(body)


def test_userdata_body_is_bounded(server, monkeypatch):
    monkeypatch.setattr(routes_userdata, "MAX_USERDATA_BYTES", 1000)

    async def body():
        client = Client(server.url)
        try:
            status, _, _ = await client.request("POST", "/api/userdata/workflows%2Fbig.json", b"x" * 1001)
            assert status == 413 and not (user_folder(server) / "workflows" / "big.json").exists()
            status, _, _ = await client.request("POST", "/api/userdata/workflows%2Fsmall.json", b"x" * 1000)
            assert status == 200
        finally:
            await client.close()

    run_async(body)


def test_user_css_is_the_only_file_served_inline(server):
    async def body():
        client = Client(server.url)
        try:
            await client.request("POST", "/api/userdata/user.css", b"body { color: red }")
            await client.request("POST", "/api/userdata/page.html", b"<script>alert(1)</script>")
            _, _, css = await client.request("GET", "/api/userdata/user.css")
            assert css["Content-Type"].startswith("text/css") and css["Content-Disposition"] == "inline"
            _, _, page = await client.request("GET", "/api/userdata/page.html")
            assert page["Content-Type"] == "application/octet-stream" and page["Content-Disposition"] == "attachment"
        finally:
            await client.close()

    run_async(body)
