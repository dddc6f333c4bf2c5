"""Info routes, static extension files, UI-format submission, WebSocket feature flags and the CLI flags."""

from __future__ import annotations

import os

import pytest

from lorabind.runtime.node_info import node_info
from server_client import Client, run_async
from server_fake_nodes import FAKE_NODES, count_and_save


def test_object_info_matches_node_info_for_every_node(server):
    async def body():
        client = Client(server.url)
        try:
            status, info = await client.get("/object_info")
            assert status == 200 and sorted(info) == sorted(FAKE_NODES)
            steps = info["SrvCountSteps"]
            assert steps["input"]["required"]["steps"] == ["INT", {"default": 3, "min": 1, "max": 10000}]
            assert steps["input_order"] == {"required": ["steps", "delay"]}
            assert steps["output"] == ["INT"] and steps["output_node"] is False
            assert info["SrvSaveImage"]["output_node"] is True
            _, one = await client.get("/api/object_info/SrvFail")
            assert one == {"SrvFail": node_info("SrvFail", FAKE_NODES["SrvFail"])}
            _, missing = await client.get("/object_info/NoSuchNode")
            assert missing == {}
        finally:
            await client.close()

    run_async(body)


def test_system_info_routes(server):
    async def body():
        client = Client(server.url)
        try:
            _, stats = await client.get("/system_stats")
            assert stats["system"]["comfyui_version"].startswith("lorabind-")
            assert stats["system"]["ram_total"] >= stats["system"]["ram_free"] > 0
            assert stats["devices"] and {"name", "type", "vram_total", "vram_free"} <= set(stats["devices"][0])
            assert (await client.get("/embeddings"))[1] == []
            _, folders = await client.get("/models")
            assert "loras" in folders
            assert (await client.get("/models/loras"))[1] == []
            assert (await client.get("/models/not-a-kind"))[0] == 404
            assert (await client.get("/api/i18n"))[1] == {}
            assert (await client.get("/api/global_subgraphs"))[1] == {}
            _, library = await client.get("/api/experiment/models")
            loras = next(kind for kind in library if kind["name"] == "loras")
            assert loras["folders"] == [os.path.join(server.config.models_root, "loras")]
            assert (await client.get("/api/experiment/models/loras"))[1] == []
            os.makedirs(loras["folders"][0], exist_ok=True)
            with open(os.path.join(loras["folders"][0], "mine.safetensors"), "wb") as f:
                f.write(b"12345")
            _, files = await client.get("/api/experiment/models/loras")
            assert [(f["name"], f["pathIndex"], f["size"]) for f in files] == [("mine.safetensors", 0, 5)]
            assert (await client.get("/api/experiment/models/not-a-kind"))[0] == 404
            _, features = await client.get("/api/features")
            assert features == {"supports_preview_metadata": True, "max_upload_size": 100 * 1024 * 1024}
        finally:
            await client.close()

    run_async(body)


def test_extension_files_listed_and_served(server):
    async def body():
        client = Client(server.url)
        try:
            _, urls = await client.get("/extensions")
            assert urls == ["/extensions/lorabind/lorabind.js", "/extensions/lorabind/lorabind_badge.js",
                            "/extensions/lorabind/lorabind_badge_size.js", "/extensions/lorabind/lorabind_contracts.js",
                            "/extensions/lorabind/lorabind_start.js"]
            status, js = await client.get(urls[0])
            assert status == 200 and b"app.registerExtension" in js
            # ComfyUI loads every .js file as an extension: the helper modules must register nothing of their own
            for helper in urls[1:4]:
                status, js = await client.get(helper)
                assert status == 200 and b"export function" in js, helper
                assert b"scripts/app.js" not in js and b".registerExtension(" not in js, helper
            status, css = await client.get("/extensions/lorabind/lorabind.css")
            assert status == 200 and b".lorabind-badge" in css
            assert (await client.get("/extensions/lorabind/../../pyproject.toml"))[0] == 404
        finally:
            await client.close()

    run_async(body)


def test_the_template_index_lists_ui_templates_only_each_with_a_title_and_a_description(server):
    """Issue 54: the editor's cards showed the file stem only (a pack's /workflow_templates carries names alone);
    the index carries each template's title and description, from its first note, and nothing is listed twice."""
    from lorabind.runtime.server.config import PACK_DIR

    expected = sorted(p.name[:-5] for p in (PACK_DIR / "workflows").glob("*.json")
                      if not p.name.startswith("comfy_"))  # ComfyUI-native ones run inside ComfyUI only

    async def body():
        client = Client(server.url)
        try:
            _, index = await client.get("/templates/index.json")
            (category,) = index
            cards = {card["name"]: card for card in category["templates"]}
            assert sorted(cards) == expected  # ordered by importance: test_server_template_thumbnails
            assert cards["wan22_lightx2v_4step"]["title"] == "Wan2.2 lightx2v 4 steps (start here)"
            assert all(card["title"] != card["name"] and 20 < len(card["description"]) <= 160
                       for card in cards.values()), cards
            assert (await client.get("/workflow_templates"))[1] == {}  # not a second time, by file name
            for name in expected:
                for url in (f"/templates/{name}.json", f"/api/workflow_templates/lorabind/{name}.json"):
                    status, workflow = await client.get(url)
                    assert status == 200 and isinstance(workflow["nodes"], list)
            assert (await client.get("/templates/..%2Fconfig.json"))[0] == 404
            assert (await client.get("/templates/comfy_wan22_lightx2v_4step.json"))[0] == 404
        finally:
            await client.close()

    run_async(body)


def test_ui_format_workflow_is_converted_and_run(server):
    ui_workflow = {
        "last_node_id": 2, "last_link_id": 1, "version": 0.4,
        "nodes": [
            {"id": 1, "type": "SrvCountSteps", "mode": 0, "inputs": [],
             "outputs": [{"name": "INT", "type": "INT", "links": [1]}], "widgets_values": [2, 0.0]},
            {"id": 2, "type": "SrvSaveImage", "mode": 0,
             "inputs": [{"name": "value", "type": "INT", "link": 1, "widget": {"name": "value"}}],
             "outputs": [], "widgets_values": [0, "ui"]},
        ],
        "links": [[1, 1, 0, 2, 0, "INT"]],
    }

    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            pid = (await client.queue_prompt(ui_workflow))["prompt_id"]
            await client.wait_done(pid)
            _, history = await client.get(f"/history/{pid}")
            entry = history[pid]
            assert entry["prompt"][2]["2"]["inputs"] == {"value": ["1", 0], "prefix": "ui"}
            assert entry["outputs"]["2"]["images"][0]["filename"] == "ui_00002.png"
        finally:
            await client.close()

    run_async(body)


def test_websocket_feature_flags_and_reconnect_status(server):
    async def body():
        client = Client(server.url, "flags")
        try:
            hello = await client.connect()
            assert hello["data"]["sid"] == "flags"
            await client.ws.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
            reply = await client.receive()
            assert reply == {"type": "feature_flags",
                             "data": {"supports_preview_metadata": True, "max_upload_size": 100 * 1024 * 1024}}
            pid = (await client.queue_prompt(count_and_save(steps=300, delay=0.01)))["prompt_id"]
            while (await client.receive())["type"] != "progress":
                pass
            # a second socket with the same id and its token replaces the first and learns what is running
            second = Client(server.url, "flags")
            try:
                status = await second.connect(token=hello["data"]["client_token"])
                assert status["data"]["sid"] == "flags"
                assert status["data"]["status"]["exec_info"]["queue_remaining"] == 1
                assert await second.receive() == {"type": "executing", "data": {"node": "1"}}
                await second.post("/interrupt", {})
                seen = await second.wait_done(pid)
                assert "execution_interrupted" in [m["type"] for m in seen]
            finally:
                await second.close()
            anonymous = Client(server.url, "")
            try:
                assert len((await anonymous.connect())["data"]["sid"]) == 32
            finally:
                await anonymous.close()
        finally:
            await client.close()

    run_async(body)


@pytest.mark.slow
def test_free_resets_the_worker_cache_between_prompts(server):
    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            first = (await client.queue_prompt(count_and_save(steps=1, prefix="c")))["prompt_id"]
            await client.wait_done(first)
            again = (await client.queue_prompt(count_and_save(steps=1, prefix="c")))["prompt_id"]
            cached = [m["data"]["nodes"] for m in await client.wait_done(again) if m["type"] == "execution_cached"]
            assert sorted(cached[0]) == ["1", "2"]
            assert (await client.post("/free", {"unload_models": True, "free_memory": True}))[0] == 200
            after = (await client.queue_prompt(count_and_save(steps=1, prefix="c")))["prompt_id"]
            cached = [m["data"]["nodes"] for m in await client.wait_done(after) if m["type"] == "execution_cached"]
            assert cached == [[]]
        finally:
            await client.close()

    run_async(body)


def test_serve_cli_flags_parse_like_comfyui():
    from lorabind.runtime.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert (args.listen, args.port, args.enable_cors_header, args.max_upload_size) == ("127.0.0.1", 8188, None,
                                                                                        100.0)
    args = parser.parse_args(["serve", "--listen", "--port", "9000", "--enable-cors-header",
                              "--max-upload-size", "5", "--models", "m", "--output", "o"])
    assert (args.listen, args.port, args.enable_cors_header) == ("0.0.0.0,::", 9000, "*")
    assert (args.max_upload_size, args.models, args.output) == (5.0, "m", "o")
    args = parser.parse_args(["serve", "--enable-cors-header", "http://a.example"])
    assert args.enable_cors_header == "http://a.example"


def test_serve_command_builds_the_config_and_forces_offline(monkeypatch, tmp_path):
    from lorabind.runtime import server as server_package
    from lorabind.runtime.cli import main

    started = []
    monkeypatch.setattr(server_package, "run_server", started.append)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert main(["serve", "--port", "0", "--models", str(tmp_path / "m"), "--output", str(tmp_path / "o"),
                 "--enable-cors-header", "--max-upload-size", "2.5"]) == 0
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    (config,) = started
    assert (config.listen, config.port, config.cors_origin) == ("127.0.0.1", 0, "*")
    assert (config.models_root, config.output_dir) == (str(tmp_path / "m"), str(tmp_path / "o"))
    assert config.max_upload_bytes == round(2.5 * 1024 * 1024)
    assert main(["serve", "--max-upload-size", "0"]) == 2 and len(started) == 1
