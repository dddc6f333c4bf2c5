"""``lorabind serve``'s live previews (issue 56): binary WebSocket frames in ComfyUI's byte layout, one per step of
the main example, to the client that queued it only (the metadata form to a client that announced
``supports_preview_metadata``, with or without the step engine), a prompt's own ``preview_method`` obeyed, and a
video job's status carrying its sampler's step and, on request, that step's preview.

The first part needs no model (the frame layout, the flags); the served runs are ``slow``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import threading
import time
import urllib.request

import numpy as np
import pytest
from PIL import Image

from lorabind.nodes import comfy_bridge
from lorabind.runtime.cli import build_parser
from lorabind.runtime.preview_options import PreviewOptions, preview_options
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from lorabind.runtime.server.websocket import preview_frame
from server_client import Client, run_async
from serving_helpers import EXAMPLE

JPEG = b"\xff\xd8\xff\xe0 a jpeg"
PREVIEW = {"prompt_id": "p-1", "node": "6", "value": 2, "max": 4, "image": JPEG, "image_type": "image/jpeg"}


def parse_frame(frame: bytes) -> tuple:
    """(event type, metadata or image type, image) read as ComfyUI's frontend reads a binary message."""
    kind, second = struct.unpack(">II", frame[:8])
    if kind == 4:
        return kind, json.loads(frame[8:8 + second]), frame[8 + second:]
    return kind, second, frame[8:]


def test_preview_frames_are_comfyuis_byte_layout():
    assert parse_frame(preview_frame(PREVIEW, with_metadata=False)) == (1, 1, JPEG)  # PREVIEW_IMAGE, JPEG
    assert parse_frame(preview_frame(PREVIEW, with_metadata=True)) == (4, {
        "node_id": "6", "prompt_id": "p-1", "display_node_id": "6", "parent_node_id": None, "real_node_id": "6",
        "image_type": "image/jpeg"}, JPEG)


def test_serve_previews_by_default_cheaply_and_takes_comfyuis_flags(tmp_path):
    defaults = preview_options(build_parser().parse_args(["serve"]))
    assert defaults == PreviewOptions("auto", 512, 100) == ServerConfig().previews
    args = build_parser().parse_args(["serve", "--preview-method", "none", "--preview-size", "256",
                                      "--preview-interval", "0"])
    assert preview_options(args) == PreviewOptions("none", 256, 0)
    assert preview_options(build_parser().parse_args(["serve", "--preview-size", "9"])) == (
        "--preview-size must be from 16 to 4096 pixels, got 9")


def test_a_prompts_own_preview_method_wins_unless_it_says_default():
    served = PreviewOptions("auto", 512, 0)
    assert served.for_prompt({"preview_method": "none"})["method"] == "none"
    assert served.for_prompt({"preview_method": "default"})["method"] == "auto"
    assert PreviewOptions("none").for_prompt({"preview_method": "latent2rgb"})["method"] == "latent2rgb"
    assert PreviewOptions.of_prompt({"lorabind_previews": served.for_prompt({"preview_method": "none"})}) is None


@pytest.fixture(scope="module")
def served(tiny_models_root, tmp_path_factory):
    """The tiny models served with every step previewed (``--preview-interval 0``), the main example also as the
    OpenAI video model ``wan``, and ``--max-batch 2`` (the step engine)."""
    root = tmp_path_factory.mktemp("previews")
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), max_batch=2,
                          previews=PreviewOptions("auto", interval_ms=0), openai_models=(("wan", str(EXAMPLE)),))
    server = BackgroundServer(config).start(timeout=300)
    yield server
    server.stop()


def _main_example(seed: int, **extra_data) -> dict:
    prompt = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    prompt["6"]["inputs"]["seed"] = seed
    return {"prompt": prompt, **({"extra_data": extra_data} if extra_data else {})}


async def _run(client: Client, body: dict) -> tuple:
    """(prompt id, the prompt's text messages, the binary frames that came meanwhile)."""
    start = len(client.binary)
    pid = (await client.queue_prompt(body["prompt"], **{k: v for k, v in body.items() if k != "prompt"}))["prompt_id"]
    seen = await client.wait_done(pid, timeout=300)
    return pid, seen, client.binary[start:]


@pytest.mark.slow
def test_each_step_of_the_main_example_reaches_its_client_as_a_preview_frame(served):
    async def body():
        legacy, modern, other = Client(served.url, "legacy"), Client(served.url, "modern"), Client(served.url, "other")
        try:
            for client in (legacy, modern, other):
                await client.connect()
            await modern.ws.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
            assert (await modern.receive())["data"]["supports_preview_metadata"] is True
            _, seen, frames = await _run(legacy, _main_example(301))
            steps = [m["data"]["value"] for m in seen if m["type"] == "progress"]
            assert steps == [1, 2, 3, 4] and [parse_frame(f)[:2] for f in frames] == [(1, 1)] * 4
            assert [Image.open(io.BytesIO(parse_frame(f)[2])).size for f in frames] == [(512, 512)] * 4
            pid, _, frames = await _run(modern, _main_example(302))
            assert [parse_frame(f)[1]["node_id"] for f in frames] == ["6"] * 4
            assert {parse_frame(f)[1]["prompt_id"] for f in frames} == {pid}
            _, _, frames = await _run(modern, _main_example(303, preview_method="none"))
            assert frames == []  # the frontend's per-prompt setting, as ComfyUI 0.30 reads it
            await asyncio.sleep(0.5)  # anything meant for another client would have come by now
            assert other.binary == []
        finally:
            for client in (legacy, modern, other):
                await client.close()

    run_async(body)


@pytest.mark.slow
def test_two_prompts_batched_by_the_step_engine_each_preview_to_their_own_client(served):
    async def body():
        clients = [Client(served.url, f"batched-{index}") for index in range(2)]
        try:
            for client in clients:
                await client.connect()
                await client.ws.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
                await client.receive()
            runs = await asyncio.gather(*[_run(client, _main_example(310 + index))
                                          for index, client in enumerate(clients)])
            for pid, _, frames in runs:
                assert [parse_frame(f)[1]["prompt_id"] for f in frames] == [pid] * 4
        finally:
            for client in clients:
                await client.close()

    run_async(body)


@pytest.mark.slow
def test_a_running_video_job_reports_its_step_and_on_request_its_preview(served, monkeypatch):
    at_step_two, go_on = threading.Event(), threading.Event()
    update = comfy_bridge.ProgressBar.update_absolute

    def held_at_step_two(bar, value, *args, **kwargs):  # the sampler stops after step 2 until the test has looked
        update(bar, value, *args, **kwargs)
        if value == 2:
            at_step_two.set()
            go_on.wait(60)

    monkeypatch.setattr(comfy_bridge.ProgressBar, "update_absolute", held_at_step_two)

    def get(path: str) -> dict:
        with urllib.request.urlopen(served.url + path, timeout=30) as reply:
            return json.load(reply)

    request = urllib.request.Request(served.url + "/v1/videos", data=json.dumps(
        {"model": "wan", "prompt": "a cat", "seed": 320}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        video_id = json.load(reply)["id"]
    try:
        assert at_step_two.wait(300)
        job = get(f"/v1/videos/{video_id}")
        assert (job["status"], job["progress"], job["step"], job["num_inference_steps"]) == ("in_progress", 50, 2, 4)
        assert "preview" not in job
        preview = get(f"/v1/videos/{video_id}?preview=true")["preview"]
        assert (preview["step"], preview["media_type"]) == (2, "image/jpeg")
        picture = np.asarray(Image.open(io.BytesIO(base64.b64decode(preview["b64_json"]))))
        assert picture.shape == (512, 512, 3)
    finally:
        go_on.set()
    deadline = time.monotonic() + 300
    while (job := get(f"/v1/videos/{video_id}"))["status"] == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job["status"] == "completed" and "step" not in job
