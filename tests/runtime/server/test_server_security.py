"""Hostile and broken requests: path escapes, cross-origin browsers, oversized and malformed bodies.

After each refusal the server must still serve (checked with ``GET /prompt``).
"""

from __future__ import annotations

import os

import aiohttp

from server_client import Client, run_async, start_server
from server_fake_nodes import count_and_save


async def _still_serving(client: Client) -> None:
    status, body = await client.get("/prompt")
    assert status == 200 and "exec_info" in body


def test_view_refuses_paths_outside_its_folders(server, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    output = tmp_path / "output"
    (output / "ok.txt").write_text("fine")
    os.symlink(secret, output / "link.txt")

    async def body():
        client = Client(server.url)
        try:
            status, data = await client.get("/view", params={"filename": "ok.txt"})
            assert status == 200 and data == b"fine"
            for params, expected in [
                ({"filename": "../secret.txt"}, 400),
                ({"filename": str(secret)}, 400),
                ({"filename": "secret.txt", "subfolder": ".."}, 403),
                ({"filename": "secret.txt", "subfolder": "../"}, 403),
                ({"filename": "secret.txt", "subfolder": str(tmp_path)}, 403),
                ({"filename": "link.txt"}, 404),  # symlink resolving outside the output folder
                ({"filename": "ok.txt", "type": "models"}, 400),
                ({"filename": "missing.png"}, 404),
            ]:
                status, data = await client.get("/view", params=params)
                assert status == expected, (params, status)
                assert b"top secret" not in (data if isinstance(data, bytes) else str(data).encode())
                await _still_serving(client)
        finally:
            await client.close()

    run_async(body)


def test_view_serves_html_as_download_not_page(server, tmp_path):
    (tmp_path / "output" / "page.html").write_text("<script>alert(1)</script>")

    async def body():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.url}/view", params={"filename": "page.html"}) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == "application/octet-stream"

    run_async(body)


def _upload_form(name: str, data: bytes, **fields) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("image", data, filename=name, content_type="image/png")
    for key, value in fields.items():
        form.add_field(key, value)
    return form


def _raw_upload(name: str, data: bytes, **fields) -> tuple[bytes, dict]:
    """Multipart bytes written by hand: aiohttp's FormData would percent-encode the hostile file names, while
    browsers and ``requests`` send them verbatim."""
    parts = [f'--B\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--B\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
                 "Content-Type: image/png\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + b"--B--\r\n", {"Content-Type": "multipart/form-data; boundary=B"}


def test_upload_image_confined_and_deduplicated(server, tmp_path):
    async def body():
        client = Client(server.url)
        try:
            status, reply = await client.post("/upload/image", _upload_form("a.png", b"one"))
            assert (status, reply) == (200, {"name": "a.png", "subfolder": "", "type": "input"})
            status, reply = await client.post("/upload/image", _upload_form("a.png", b"one"))
            assert reply["name"] == "a.png"  # same bytes: reused
            status, reply = await client.post("/upload/image", _upload_form("a.png", b"two"))
            assert reply["name"] == "a (1).png"
            assert (tmp_path / "input" / "a (1).png").read_bytes() == b"two"
            status, reply = await client.post("/upload/image", _upload_form("a.png", b"three", overwrite="true"))
            assert reply["name"] == "a.png" and (tmp_path / "input" / "a.png").read_bytes() == b"three"
            status, reply = await client.post("/api/upload/image", _upload_form("b.png", b"x", subfolder="sub",
                                                                                 type="temp"))
            assert reply == {"name": "b.png", "subfolder": "sub", "type": "temp"}
            assert (tmp_path / "temp" / "sub" / "b.png").read_bytes() == b"x"

            for name, fields, expected in [("../evil.png", {}, 400), ("/tmp/evil.png", {}, 400),
                                           ("x/../../evil.png", {}, 400), ("..\\evil.png", {}, 400),
                                           ("ok.png", {"subfolder": "../.."}, 403),
                                           ("ok.png", {"subfolder": str(tmp_path)}, 403),
                                           ("ok.png", {"type": "models"}, 400)]:
                data, headers = _raw_upload(name, b"evil", **fields)
                status, reply = await client.post("/upload/image", data, headers=headers)
                assert status == expected, (name, fields, status)
                await _still_serving(client)
            assert not (tmp_path / "evil.png").exists() and not (tmp_path / "ok.png").exists()
            assert sorted(p.name for p in (tmp_path / "input").iterdir()) == ["a (1).png", "a.png"]
        finally:
            await client.close()

    run_async(body)


def test_cross_origin_browser_post_is_refused(server):
    async def body():
        client = Client(server.url)
        try:
            prompt = {"prompt": count_and_save(steps=1)}
            status, reply = await client.post("/prompt", prompt, headers={"Origin": "http://evil.example"})
            assert status == 403 and reply["error"]["type"] == "forbidden_origin"
            status, _ = await client.post("/api/interrupt", {}, headers={"Origin": "https://evil.example:8188"})
            assert status == 403
            assert (await client.get("/queue"))[1]["queue_pending"] == []
            host = server.url.split("//")[1]
            other_port = f"http://127.0.0.1:{server.port + 1}"
            assert (await client.post("/prompt", prompt, headers={"Origin": other_port}))[0] == 403
            status, reply = await client.post("/prompt", prompt, headers={"Origin": f"http://{host}"})
            assert status == 200 and "prompt_id" in reply
            await _still_serving(client)
        finally:
            await client.close()

    run_async(body)


def test_cors_flag_allows_the_configured_origin(tmp_path):
    srv = start_server(tmp_path, cors_origin="http://studio.example")

    async def body():
        async with aiohttp.ClientSession() as session:
            headers = {"Origin": "http://studio.example"}
            async with session.get(f"{srv.url}/prompt", headers=headers) as resp:
                assert resp.status == 200
                assert resp.headers["Access-Control-Allow-Origin"] == "http://studio.example"
            async with session.options(f"{srv.url}/prompt", headers=headers) as resp:
                assert resp.status == 200
                assert "POST" in resp.headers["Access-Control-Allow-Methods"]
            # a refusal is readable by the allowed page too: the CORS headers come with the 400 body
            async with session.post(f"{srv.url}/prompt", data="{not json", headers=headers) as resp:
                assert resp.status == 400
                assert resp.headers["Access-Control-Allow-Origin"] == "http://studio.example"
                assert (await resp.json())["error"]["type"] == "invalid_json"

    try:
        run_async(body)
    finally:
        srv.stop()


def test_oversized_body_is_413_and_server_keeps_serving(tmp_path):
    srv = start_server(tmp_path, max_upload_mb=0.01)

    async def body():
        client = Client(srv.url)
        try:
            big = {"prompt": count_and_save(steps=1), "extra_data": {"blob": "x" * 20000}}
            status, _ = await client.post("/prompt", big)
            assert status == 413
            status, _ = await client.post("/upload/image", _upload_form("big.png", b"\0" * 20000))
            assert status == 413
            assert not (tmp_path / "input" / "big.png").exists()
            await _still_serving(client)
            _, flags = await client.get("/features")
            assert flags["max_upload_size"] == round(0.01 * 1024 * 1024)
        finally:
            await client.close()

    try:
        run_async(body)
    finally:
        srv.stop()


def test_malformed_and_invalid_prompts_get_comfyui_400_shapes(server):
    async def body():
        client = Client(server.url)
        try:
            status, reply = await client.post("/prompt", b"{not json")
            assert status == 400 and reply["error"]["type"] == "invalid_json" and reply["node_errors"] == {}
            status, reply = await client.post("/prompt", b"[1, 2]")
            assert status == 400 and reply["error"]["type"] == "invalid_json"
            status, reply = await client.post("/prompt", {"client_id": "x"})
            assert status == 400 and reply == {"error": {
                "type": "no_prompt", "message": "No prompt provided",
                "details": 'The body must be {"prompt": <API prompt or UI workflow>, "client_id": "<your id>"} '
                           '(client_id is optional; it routes the WebSocket messages to you)',
                "extra_info": {}}, "node_errors": {}}
            status, reply = await client.post("/prompt", {"prompt": {"1": {"class_type": "NoSuchNode",
                                                                            "inputs": {}}}})
            assert status == 400 and reply["error"]["type"] == "invalid_prompt"
            assert "NoSuchNode" in reply["error"]["message"] and reply["node_errors"] == {}
            status, reply = await client.post("/prompt", {"prompt": {"1": {"class_type": "SrvCountSteps",
                                                                            "inputs": {"steps": 1, "delay": 0}}}})
            assert status == 400 and reply["error"]["type"] == "prompt_no_outputs"
            missing = {"1": {"class_type": "SrvSaveImage", "inputs": {"prefix": "p"}}}
            status, reply = await client.post("/prompt", {"prompt": missing})
            assert status == 400 and reply["error"]["type"] == "prompt_outputs_failed_validation"
            node_error = reply["node_errors"]["1"]
            assert node_error["class_type"] == "SrvSaveImage" and node_error["dependent_outputs"] == ["1"]
            assert node_error["errors"][0]["type"] == "required_input_missing"
            assert node_error["errors"][0]["extra_info"]["input_name"] == "value"
            cycle = {"1": {"class_type": "SrvCountSteps", "inputs": {"steps": ["1", 0], "delay": 0}},
                     "2": {"class_type": "SrvSaveImage", "inputs": {"value": ["1", 0], "prefix": "c"}}}
            status, reply = await client.post("/prompt", {"prompt": cycle})
            assert status == 400 and "cycle" in reply["node_errors"]["1"]["errors"][0]["details"].lower()
            for ui in ({"nodes": [{"id": 1, "type": "Nope", "widgets_values": []}], "links": []},
                       {"nodes": [{"id": 1}], "links": []}):
                status, reply = await client.post("/prompt", {"prompt": ui})
                assert status == 400 and reply["error"]["type"] == "invalid_prompt", reply
            status, reply = await client.post("/prompt", {"prompt": "not a graph"})
            assert status == 400 and reply["error"]["type"] == "invalid_prompt"
            # shapes no client should send: each a 400 naming the problem, never a 500
            for bad_node in ({"class_type": ["SrvSaveImage"], "inputs": {}},
                             {"class_type": "SrvSaveImage", "inputs": ["value", 1]}):
                status, reply = await client.post("/prompt", {"prompt": {"7": bad_node}})
                assert status == 400 and reply["error"]["type"] == "invalid_prompt", reply
                assert reply["error"]["details"] == "Node ID '#7'"
            for number in ("soon", "Infinity", "NaN"):
                raw = b'{"prompt": {}, "number": ' + (f'"{number}"' if number == "soon" else number).encode() + b"}"
                status, reply = await client.post("/prompt", raw)
                assert status == 400 and "Field 'number' must be a finite number" in reply["error"]["message"]
            status, reply = await client.post("/queue", b"{{")
            assert status == 400 and reply["error"]["type"] == "invalid_json"
            assert (await client.get("/queue"))[1] == {"queue_running": [], "queue_pending": [],
                                                       "lorabind_background": None}
            await _still_serving(client)
        finally:
            await client.close()

    run_async(body)


def test_cross_origin_websocket_is_refused(server):
    async def body():
        async with aiohttp.ClientSession() as session:
            try:
                await session.ws_connect(f"{server.url}/ws?clientId=x", headers={"Origin": "http://evil.example"})
                raise AssertionError("cross-origin websocket was accepted")
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 403
            async with session.ws_connect(f"{server.url}/ws?clientId=x") as ws:
                assert (await ws.receive_json())["type"] == "status"

    run_async(body)
