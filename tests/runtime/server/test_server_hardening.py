"""Hostile input found by issue #13: server state out of reach of uploads, history that survives any file content,
DNS rebinding, preview pixel bounds, upload and download names, deeply nested JSON."""

from __future__ import annotations

import json
import logging
import struct
import zlib

import aiohttp
import pytest

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.history import HistoryStore
from server_client import Client, run_async, start_server
from server_fake_nodes import count_and_save

DEEP = b"[" * 100_000


def _entry(n: int) -> dict:
    return {"prompt": [n, f"p{n}", {}, {}, []], "outputs": {}, "status": {"status_str": "success",
                                                                          "completed": True, "messages": []},
            "meta": {}}


@pytest.mark.parametrize("content", [
    '{"seq": 1e400, "prompt_id": "x", "entry": {}}',
    "[" * 100_000,
    '{"seq": 3, "prompt_id": ["x"], "entry": {}}',
    '{"seq": true, "prompt_id": "x", "entry": {}}',
    '{"seq": 3, "prompt_id": "x", "entry": [1]}',
    '[1, 2]',
    "\udcff",
])
def test_history_loading_skips_any_bad_file_and_keeps_the_good_ones(tmp_path, content, caplog):
    folder = tmp_path / "history"
    HistoryStore(folder).add("good", _entry(1))
    bad = folder / "000000000000-bad.json"
    bad.write_text(content, encoding="utf-8", errors="surrogateescape")
    with caplog.at_level(logging.WARNING, logger="lorabind.server"):
        store = HistoryStore(folder)
    assert list(store.list()) == ["good"]
    assert bad.with_suffix(".corrupt").exists() and not bad.exists()
    assert "history entry" in caplog.text and "Traceback" not in caplog.text


def test_history_lives_outside_every_folder_uploads_reach(tmp_path):
    srv = start_server(tmp_path)
    try:
        state = tmp_path / ".lorabind-state"
        assert srv.config.state_dir == str(state) and (state / "history").is_dir()
        forged = json.dumps({"seq": 0, "prompt_id": "forged", "entry": _entry(0)}).encode()

        async def body():
            client = Client(srv.url)
            try:
                for kind, subfolder, expected in [("output", ".lorabind/history", 200),
                                                  ("output", "../.lorabind-state/history", 403),
                                                  ("input", "../.lorabind-state/history", 403)]:
                    form = aiohttp.FormData()
                    form.add_field("image", forged, filename="000000000000-x.json")
                    form.add_field("type", kind)
                    form.add_field("subfolder", subfolder)
                    status, _ = await client.post("/upload/image", form)
                    assert status == expected, (kind, subfolder)
            finally:
                await client.close()

        run_async(body)
    finally:
        srv.stop()
    assert list((tmp_path / ".lorabind-state" / "history").iterdir()) == []
    restarted = start_server(tmp_path)
    try:
        assert restarted.app  # started, and with no made-up entry
        from lorabind.runtime.server.composition_root import STATE_KEY

        assert restarted.app[STATE_KEY].history.list() == {}
    finally:
        restarted.stop()


def test_a_state_folder_inside_an_upload_folder_is_refused(tmp_path):
    config = ServerConfig(models_root=str(tmp_path / "m"), output_dir=str(tmp_path / "out"),
                          input_dir=str(tmp_path / "in"), temp_dir=str(tmp_path / "t"),
                          state_dir=str(tmp_path / "in" / "state"))
    with pytest.raises(ValueError, match=r"inside the input folder .*--state-dir"):
        config.resolved()


def test_dns_rebinding_host_names_are_refused_on_loopback(tmp_path):
    srv = start_server(tmp_path)
    allowing = start_server(tmp_path / "b", allowed_hosts=("studio.lan",))

    async def body():
        client = Client(srv.url)
        try:
            evil = {"Host": f"evil.com:{srv.port}", "Origin": f"http://evil.com:{srv.port}"}
            status, reply = await client.post("/prompt", {"prompt": count_and_save(steps=1)}, headers=evil)
            assert status == 403 and reply["error"]["type"] == "forbidden_host"
            assert "--allowed-hosts" in reply["error"]["message"]
            assert (await client.get("/history", headers=evil))[0] == 403
            for host in (f"localhost:{srv.port}", f"127.0.0.5:{srv.port}", f"[::1]:{srv.port}", "app.localhost"):
                assert (await client.get("/prompt", headers={"Host": host}))[0] == 200, host
            assert (await client.get("/queue"))[1]["queue_pending"] == []
            other = Client(allowing.url)
            try:
                assert (await other.get("/prompt", headers={"Host": "studio.lan"}))[0] == 200
                assert (await other.get("/prompt", headers={"Host": "evil.com"}))[0] == 403
            finally:
                await other.close()
        finally:
            await client.close()

    try:
        run_async(body)
    finally:
        srv.stop()
        allowing.stop()


def _png_header_only(width: int, height: int) -> bytes:
    """A valid PNG declaring a huge canvas whose pixels compress to almost nothing (one row repeated)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = zlib.compress((b"\0" + b"\0" * width) * height, 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


def test_previews_of_huge_images_are_refused_before_decoding(server, tmp_path):
    (tmp_path / "output" / "huge.png").write_bytes(_png_header_only(9000, 8000))

    async def body():
        client = Client(server.url)
        try:
            status, reply = await client.get("/view", params={"filename": "huge.png", "preview": "webp;90"})
            assert status == 400 and reply["error"]["type"] == "image_too_large"
            assert "9000x8000" in reply["error"]["message"]
            status, data = await client.get("/view", params={"filename": "huge.png"})
            assert status == 200 and data[:4] == b"\x89PNG"  # the file itself, not decoded
        finally:
            await client.close()

    run_async(body)


def test_upload_names_with_line_breaks_or_too_long_are_400(server, tmp_path):
    from test_server_security import _raw_upload

    async def body():
        client = Client(server.url)
        try:
            for name in ("a\r\nb.png", "a\nb.png", "x" * 252 + ".png", "é" * 130 + ".png"):
                data, headers = _raw_upload(name, b"img")
                status, reply = await client.post("/upload/image", data, headers=headers)
                # a raw line break ends the part header early: the body is malformed (invalid_request)
                assert status == 400, (name, status)
                assert reply["error"]["type"] in (("invalid_request",) if "\n" in name else ("invalid_path",))
            form = aiohttp.FormData()
            form.add_field("image", b"img", filename="ok.png")
            form.add_field("subfolder", "d" * 300)
            assert (await client.post("/upload/image", form))[0] == 403
            assert sorted(p.name for p in (tmp_path / "input").iterdir()) == []
        finally:
            await client.close()

    run_async(body)


def test_content_disposition_names_are_escaped(server, tmp_path):
    name = 'we"ird ü;name.txt'
    (tmp_path / "output" / name).write_text("x")

    async def body():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.url}/view", params={"filename": name}) as resp:
                header = resp.headers["Content-Disposition"]
        assert header == "filename=\"we_ird _;name.txt\"; filename*=UTF-8''we%22ird%20%C3%BC%3Bname.txt"

    run_async(body)


def test_deeply_nested_json_is_a_400_and_the_websocket_logs_nothing(server, caplog):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            status, reply = await client.post("/prompt", DEEP)
            assert status == 400 and reply["error"]["type"] == "invalid_json"
            assert "nested more than" in reply["error"]["message"]
            status, reply = await client.post("/prompt", b'{"prompt": ' + b"[" * 500 + b"]" * 500 + b"}")
            assert status == 400 and "nested more than" in reply["error"]["message"]
            await client.ws.send_str(DEEP.decode())
            await client.ws.send_str(json.dumps({"type": "feature_flags", "data": {}}))
            assert (await client.receive())["type"] == "feature_flags"  # still answering
        finally:
            await client.close()

    with caplog.at_level(logging.DEBUG):
        run_async(body)
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text


def test_subgraph_bombs_are_a_400_not_a_500(server):
    loop = {"id": "loop", "name": "ouroboros", "inputs": [], "outputs": [], "links": [],
            "nodes": [{"id": 1, "type": "loop", "mode": 0}]}
    fanout = [{"id": "level-0", "name": "leaf", "inputs": [], "outputs": [], "links": [],
               "nodes": [{"id": 1, "type": "SrvSaveImage", "mode": 0, "widgets_values": ["p"]}]}]
    for level in range(1, 9):  # 4**8 = 65,536 leaves from a few KB of JSON
        fanout.append({"id": f"level-{level}", "name": f"level {level}", "inputs": [], "outputs": [], "links": [],
                       "nodes": [{"id": i, "type": f"level-{level - 1}", "mode": 0} for i in range(1, 5)]})

    async def body():
        client = Client(server.url)
        try:
            for workflow, message in (
                    ({"nodes": [{"id": 1, "type": "loop", "mode": 0}], "links": [],
                      "definitions": {"subgraphs": [loop]}}, "contains itself"),
                    ({"nodes": [{"id": 1, "type": "level-8", "mode": 0}], "links": [],
                      "definitions": {"subgraphs": fanout}}, "expand to more than")):
                status, reply = await client.post("/prompt", {"prompt": workflow})
                assert status == 400 and message in reply["error"]["message"], reply
            assert (await client.get("/queue"))[1]["queue_pending"] == []
        finally:
            await client.close()

    run_async(body)
