"""The template browser's cards (issue 30): our templates come main example first, and each has its own
thumbnail, a frame of its own output on the tiny model rendered at serve start (never committed), served where
frontend 1.58.1 asks for it (``/api/workflow_templates/lorabind/<name>.jpg``)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.families import example_order
from lorabind.runtime import folder_paths
from lorabind.runtime.server.comfy_api.template_thumbnails import render_template_thumbnails, thumbnail_folder
from lorabind.runtime.server.example_assets import ordered_templates
from server_client import Client, run_async

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"


def test_templates_are_listed_main_example_first_and_every_shipped_one_has_a_place(server):
    shipped = sorted(p.name[:-5] for p in TEMPLATES.glob("*.json")
                     if not p.name.endswith(".api.json") and not p.name.startswith("comfy_"))  # run in ComfyUI only
    assert sorted(example_order()) == shipped  # a new example must be given its place

    async def body():
        client = Client(server.url)
        try:
            status, index = await client.get("/templates/index.json")
            assert status == 200 and [card["name"] for card in index[0]["templates"]] == list(example_order())
            assert index[0]["templates"][0]["name"] == "wan22_lightx2v_4step"
            status, _ = await client.get("/api/workflow_templates/lorabind/wan22_lightx2v_4step.jpg")
            assert status == 404  # not rendered for this server: the card shows its placeholder
            folder = thumbnail_folder(server.config.state_dir)
            folder.mkdir(parents=True)
            (folder / "wan22_lightx2v_4step.jpg").write_bytes(b"\xff\xd8jpeg")
            # where frontend 1.58 asks for an index card's picture, and where it asked for a pack template's
            for url in ("/templates/wan22_lightx2v_4step-1.jpg",
                        "/api/workflow_templates/lorabind/wan22_lightx2v_4step.jpg"):
                status, picture = await client.get(url)
                assert status == 200 and picture == b"\xff\xd8jpeg"
            status, workflow = await client.get("/api/workflow_templates/lorabind/wan22_lightx2v_4step.json")
            assert status == 200 and "nodes" in workflow
            assert (await client.get("/api/workflow_templates/lorabind/..%2Fsecret.jpg"))[0] == 404
        finally:
            await client.close()

    run_async(body)


def test_unknown_templates_follow_a_to_z():
    assert ordered_templates(["zz", "minimax_h3_native", "aa", "wan22_lightx2v_4step"]) == \
        ["wan22_lightx2v_4step", "minimax_h3_native", "aa", "zz"]


@pytest.mark.slow  # runs two templates on the tiny models
def test_each_template_gets_a_frame_of_its_own_output_once(tiny_models_root, tmp_path):
    from PIL import Image

    from lorabind.runtime.core_nodes import runtime_node_classes

    served = tmp_path / "workflows"
    served.mkdir()
    for name in ("wan22_lightx2v_4step", "qwen_image_lightning", "wan22_mismatched_contract"):
        shutil.copy(WORKFLOWS / f"{name}.api.json", served)
    folder_paths.configure(models_root=str(tiny_models_root), output_dir=str(tmp_path / "output"),
                           input_dir=str(tmp_path / "input"))
    said = []
    try:
        results = render_template_thumbnails(str(served), str(tmp_path / "state"), runtime_node_classes()[0],
                                             said.append)
        assert folder_paths.get_output_directory() == str(tmp_path / "output")  # put back
    finally:
        folder_paths.configure()
    assert results["wan22_lightx2v_4step"] == results["qwen_image_lightning"] == "rendered"
    assert results["wan22_mismatched_contract"].startswith("it fails when run (") and \
        "steps" in results["wan22_mismatched_contract"]
    folder = thumbnail_folder(str(tmp_path / "state"))
    pictures = {name: Image.open(folder / f"{name}.jpg") for name in ("wan22_lightx2v_4step", "qwen_image_lightning")}
    for picture in pictures.values():
        assert picture.format == "JPEG" and max(picture.size) >= 128
        assert len(picture.convert("RGB").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 8, "a blank picture"
    assert pictures["wan22_lightx2v_4step"].tobytes() != pictures["qwen_image_lightning"].tobytes()
    assert not (tmp_path / "output").exists()  # the runs wrote nowhere the user looks
    assert said[0].startswith("rendering 3 template thumbnail(s)") and len(said) == 4  # then one line each
    assert [line for line in said if line.startswith("no thumbnail for ")] == [
        line for line in said if "wan22_mismatched_contract" in line]
    index = json.loads((folder / "index.json").read_text())
    assert {name: entry["result"] for name, entry in index.items()} == results
    # nothing changed: nothing rendered, nothing said; a changed template is rendered again
    assert render_template_thumbnails(str(served), str(tmp_path / "state"), {}, said.append) == {}
    (folder / "qwen_image_lightning.jpg").unlink()
    (served / "wan22_mismatched_contract.api.json").write_text("{}")
    # (no node classes this time: what would run again is refused at validation, which shows it was tried)
    assert render_template_thumbnails(str(served), str(tmp_path / "state"), {}, said.append) == {
        "qwen_image_lightning": "it does not validate (Cannot execute because node LoraBindModelLoader does not "
                                "exist.)",
        "wan22_mismatched_contract": "it does not validate (Prompt has no outputs)"}


def test_a_template_that_saves_a_video_gets_its_first_frame(tmp_path):
    """``minimax_h3_turbo_mp4`` writes an MP4, which Pillow cannot open: its card shows the video's frame 0."""
    import torch

    from lorabind.loaders.io.video_files import VIDEO_FORMATS, write_video
    from lorabind.runtime.server.comfy_api.template_thumbnails import _first_image

    frames = torch.zeros(3, 16, 24, 3)
    frames[0, ..., 0] = 1.0  # frame 0 red, the others black
    (tmp_path / "clips").mkdir()
    write_video(str(tmp_path / "clips" / "v.mp4"), frames, 8.0, VIDEO_FORMATS["mp4 (h264 + aac)"], 18, "ultrafast")
    outputs = {"8": {"images": [{"filename": "v.mp4", "subfolder": "clips", "type": "output"}], "animated": [True]}}
    picture = _first_image(outputs, str(tmp_path))
    red, green, blue = picture.getpixel((12, 8))
    assert picture.size == (24, 16) and red > 200 and green < 60 and blue < 60


@pytest.mark.slow  # builds the tiny models, runs a prompt and renders four thumbnails
def test_a_prompt_sent_at_start_runs_before_the_thumbnails_still_to_render(tmp_path, caplog):
    """Issue 54: the editor's first Run waited 3¾ min while 21 thumbnails rendered, then ran in 0.4 s. The worker
    starts once the models are built; each thumbnail renders only while the queue is idle, so a prompt sent at
    start waits at most for the one in progress, and the log and ``GET /queue`` say what it waits for."""
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.comfy_api.example_warm_up import warm_up_in_background
    from lorabind.runtime.server.composition_root import STATE_KEY
    from lorabind.runtime.server.in_process_server import BackgroundServer

    served = tmp_path / "workflows"
    served.mkdir()
    names = ("wan22_lightx2v_4step", "qwen_image_lightning", "wan21_distill", "wan22_tiny_t2v")
    for name in names:
        shutil.copy(WORKFLOWS / f"{name}.api.json", served)
    config = ServerConfig(port=0, models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "out"),
                          input_dir=str(tmp_path / "in"), temp_dir=str(tmp_path / "temp"),
                          state_dir=str(tmp_path / "state"), workflows_dir=str(served))
    caplog.set_level("INFO", logger="lorabind.server")
    server = BackgroundServer(config)
    warm_up_in_background(server.app, config, render_thumbnails=True)
    state = server.app[STATE_KEY]
    prompt = json.loads((served / "wan22_lightx2v_4step.api.json").read_text())

    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            for _ in range(3000):  # the models are built first (tens of seconds on a loaded machine)
                if state.models_built.is_set():
                    break
                await asyncio.sleep(0.1)
            prompt_id = (await client.queue_prompt(prompt))["prompt_id"]
            seen = [(await client.get("/queue"))[1].get("lorabind_background", "missing")]
            kinds = [m["type"] for m in await client.wait_done(prompt_id, timeout=600)]
            assert "execution_success" in kinds, kinds
            return prompt_id, seen
        finally:
            await client.close()

    with server:
        prompt_id, seen = run_async(body)
        lines = [record.getMessage() for record in caplog.records]
        finished = next(i for i, line in enumerate(lines) if line.startswith(f"prompt {prompt_id} finished"))
        rendered_before = [line for line in lines[:finished] if line.startswith("examples: thumbnail ")]
        assert len(rendered_before) <= 1, rendered_before  # at most the one in progress when it was sent
        for _ in range(6000):  # the thumbnails follow, one at a time
            if len(json.loads((thumbnail_folder(config.state_dir) / "index.json").read_text()
                              if (thumbnail_folder(config.state_dir) / "index.json").is_file() else "{}")) == 4:
                break
            time.sleep(0.1)
    index = json.loads((thumbnail_folder(config.state_dir) / "index.json").read_text())
    assert sorted(index) == sorted(names) and all(entry["result"] == "rendered" for entry in index.values())
    assert seen[0] in (None,) + tuple(f"template thumbnail {name}" for name in names)  # what a prompt waits for


def test_a_prompt_queued_behind_a_thumbnail_says_so_in_the_log(caplog):
    from lorabind.runtime.server import prompt_log

    caplog.set_level("INFO", logger="lorabind.server")
    prompt_log.queued("p1", 3, 9, "c1", "template thumbnail wan21_i2v")
    prompt_log.queued("p2", 4, 9, None)
    assert [r.getMessage() for r in caplog.records] == [
        "prompt p1 queued (#3, 9 nodes, client c1); it runs when the template thumbnail wan21_i2v in progress is "
        "done (a few seconds)", "prompt p2 queued (#4, 9 nodes)"]
