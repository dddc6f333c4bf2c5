"""``lorabind serve`` hosts the ComfyUI frontend wheel at ``/`` (or says how to install it), and answers the
``/jobs`` list its queue panel reads."""

from __future__ import annotations

import re

import pytest
import tomllib

from lorabind.runtime.server.comfy_api import routes_frontend
from lorabind.runtime.server.config import PACK_DIR
from server_client import Client, run_async, start_server
from server_fake_nodes import count_and_save

needs_frontend = pytest.mark.skipif(routes_frontend.frontend_static_dir() is None,
                                    reason='the ui extra is not installed (pip install "lorabind[ui]")')


def test_ui_extra_pins_the_frontend_version_the_server_implements():
    extras = tomllib.loads((PACK_DIR / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["ui"] == [f"{routes_frontend.FRONTEND_DISTRIBUTION}=={routes_frontend.FRONTEND_VERSION}"]


def test_without_the_ui_extra_the_index_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(routes_frontend, "frontend_static_dir", lambda: None)
    srv = start_server(tmp_path)

    async def body():
        client = Client(srv.url)
        try:
            status, text = await client.get("/")
            assert status == 200 and b'pip install "lorabind[ui]"' in text
            assert text.startswith(b"lorabind serve: ComfyUI-compatible HTTP/WebSocket API")
            assert (await client.get("/scripts/app.js"))[0] == 404
            assert (await client.get("/api/settings"))[0] == 200  # the API does not depend on the extra
        finally:
            await client.close()

    try:
        run_async(body)
    finally:
        srv.stop()


@needs_frontend
def test_frontend_index_and_assets_are_served_beside_the_api(server):
    static = routes_frontend.frontend_static_dir()
    index_html = (static / "index.html").read_bytes()
    entry = re.search(rb'src="\./(assets/index-[^"]+\.js)"', index_html).group(1).decode()

    async def body():
        client = Client(server.url)
        try:
            status, page = await client.get("/")
            assert status == 200 and page == index_html
            async with client.session.get(f"{server.url}/{entry}") as resp:
                assert resp.status == 200 and resp.content_type in ("text/javascript", "application/javascript")
                assert await resp.read() == (static / entry).read_bytes()
            # custom extensions import ComfyUI's app through the frontend's shims
            status, shim = await client.get("/scripts/app.js")
            assert status == 200 and b"window.comfyAPI.app.app" in shim
            # the API and our extension still answer first, the static mount never shadows them
            assert (await client.get("/api/settings"))[1] == {}
            assert (await client.get("/extensions"))[1] == ["/extensions/lorabind/lorabind.js",
                                                          "/extensions/lorabind/lorabind_badge.js",
                                                          "/extensions/lorabind/lorabind_badge_size.js",
                                                          "/extensions/lorabind/lorabind_contracts.js",
                                                          "/extensions/lorabind/lorabind_start.js"]
            assert (await client.get("/extensions/lorabind/lorabind.js"))[0] == 200
            assert (await client.get("/assets/../../pyproject.toml"))[0] == 404
            assert (await client.get("/no-such-file.js"))[0] == 404
            # ComfyUI's own templates are not ours to serve: the index is our examples (for every locale), no logos
            (examples,) = (await client.get("/templates/index.json"))[1]
            assert examples["category"] == "lorabind" and examples["templates"][0]["name"] == "wan22_lightx2v_4step"
            assert (await client.get("/templates/index.fr.json"))[1] == [examples]
            assert (await client.get("/templates/index_logo.json"))[1] == {}
            assert (await client.get("/templates/other.json"))[0] == 404
        finally:
            await client.close()

    run_async(body)


@needs_frontend
def test_the_editor_page_lets_the_browser_ask_only_this_server(server):
    """Issue 54: the Issues panel asked https://api.comfy.org/nodes for each node's pack; the page's policy
    (every fetch, XHR and WebSocket to this server only) makes the browser refuse it before it is sent
    (``test_server_browser_offline.py`` records it in Chromium)."""
    async def body():
        client = Client(server.url)
        try:
            async with client.session.get(f"{server.url}/") as resp:
                policy = resp.headers.get("Content-Security-Policy", "")
        finally:
            await client.close()
        assert policy.startswith("default-src 'self' ") and "http" not in policy and "*" not in policy
        assert "connect-src" not in policy  # fetch, XHR and WebSocket fall back to default-src: 'self'

    run_async(body)


def test_jobs_list_the_queue_and_history_as_the_frontend_reads_them(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            workflow = {"id": "wf-1", "nodes": []}
            done = (await client.queue_prompt(count_and_save(2, prefix="job"),
                                              extra_data={"extra_pnginfo": {"workflow": workflow}}))["prompt_id"]
            await client.wait_done(done)
            failed = (await client.queue_prompt({"1": {"class_type": "SrvFail", "inputs": {"value": 3}}}))["prompt_id"]
            await client.wait_done(failed)
            running = (await client.queue_prompt(count_and_save(200, delay=0.05)))["prompt_id"]
            pending = (await client.queue_prompt(count_and_save(1)))["prompt_id"]

            _, queue = await client.get("/api/jobs?status=in_progress,pending&limit=200&offset=0")
            assert [(j["id"], j["status"]) for j in queue["jobs"]] in (
                [(pending, "pending"), (running, "in_progress")], [(pending, "pending"), (running, "pending")])
            _, history = await client.get("/api/jobs?status=completed,failed,cancelled&limit=200&offset=0")
            assert [(j["id"], j["status"]) for j in history["jobs"]] == [(failed, "failed"), (done, "completed")]
            assert history["pagination"] == {"offset": 0, "limit": 200, "total": 2, "has_more": False}
            completed = history["jobs"][1]
            assert completed["preview_output"] == {"filename": "job_00002.png", "subfolder": "", "type": "output",
                                                   "nodeId": "2", "mediaType": "images"}
            assert completed["outputs_count"] == 1 and completed["workflow_id"] == "wf-1"
            assert completed["execution_end_time"] >= completed["execution_start_time"] >= completed["create_time"]
            # the queue panel shows only the message: it names the node (the history keeps ComfyUI's payload)
            error = history["jobs"][0]["execution_error"]
            assert error["exception_message"] == "node 1 (SrvFail): SrvFail refuses value 3\n"
            assert (error["node_id"], error["node_type"]) == ("1", "SrvFail")
            _, kept = await client.get(f"/api/history/{failed}")
            assert [m[1]["exception_message"] for m in kept[failed]["status"]["messages"]
                    if m[0] == "execution_error"] == ["SrvFail refuses value 3\n"]
            _, page = await client.get("/api/jobs?status=completed,failed&limit=1&offset=1")
            assert [j["id"] for j in page["jobs"]] == [done] and page["pagination"]["has_more"] is False

            _, detail = await client.get(f"/api/jobs/{done}")
            assert detail["outputs"]["2"]["images"][0]["filename"] == "job_00002.png"
            assert detail["workflow"]["extra_data"]["extra_pnginfo"]["workflow"] == workflow
            assert detail["workflow"]["prompt"] == count_and_save(2, prefix="job")
            assert (await client.get("/api/jobs/no-such-job"))[0] == 404
            assert (await client.get("/api/jobs?status=bogus"))[0] == 400

            status, _ = await client.post("/api/jobs/cancel", {"job_ids": [pending]})
            assert status == 200
            status, _ = await client.post(f"/api/jobs/{running}/cancel", b"")
            assert status == 200
            await client.wait_done(running)
            _, queue = await client.get("/api/jobs?status=in_progress,pending")
            assert queue["jobs"] == []
            _, cancelled = await client.get("/api/jobs?status=cancelled")
            assert [j["id"] for j in cancelled["jobs"]] == [running]
        finally:
            await client.close()

    run_async(body)
