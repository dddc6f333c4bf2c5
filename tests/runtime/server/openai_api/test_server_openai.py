"""``lorabind serve --openai-model``: the OpenAI-style endpoints, driven by the official ``openai`` client and by
vllm-omni's literal request body, against the tiny Qwen-Image Lightning and Wan2.2 lightx2v templates.

Every request here runs a whole workflow through the server's queue, so the module is ``slow``.
"""

from __future__ import annotations

import base64
import io
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

import lorabind
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from optional_extras import deferred, requires
from server_client import Client, run_async

openai = deferred("openai")
pytestmark = [requires("openai"), pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
LIGHTNING = "Qwen-Image-Lightning-4steps-V1.0.safetensors"
# vllm-omni's LoRA guide, distill backend: its curl body (prompt shortened; 64x64 instead of 1024x1024, which
# takes the tiny model over a minute on a CPU)
GUIDE_BODY = {"messages": [{"role": "user", "content": "A Chinese female college student, around 20 years old"}],
              "extra_body": {"height": 64, "width": 64, "num_inference_steps": 4, "true_cfg_scale": 1.0,
                             "seed": 42}}


def _serve(models_root, root, name: str, workflow: str) -> BackgroundServer:
    config = ServerConfig(port=0, models_root=str(models_root), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), state_dir=str(root / "state"),
                          openai_models=((name, str(WORKFLOWS / workflow)),))
    return BackgroundServer(config).start(timeout=300)


@pytest.fixture(scope="module")
def server(tiny_models_root, tmp_path_factory):
    """``lorabind serve --openai-model qwen-image=workflows/api/qwen_image_lightning.api.json``"""
    srv = _serve(tiny_models_root, tmp_path_factory.mktemp("openai"), "qwen-image", "qwen_image_lightning.api.json")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def video_server(tiny_models_root, tmp_path_factory):
    srv = _serve(tiny_models_root, tmp_path_factory.mktemp("openai_video"), "wan", "wan22_lightx2v_4step.api.json")
    yield srv
    srv.stop()


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300)


@pytest.fixture
def client(server):
    return _client(server)


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _png(data_url: str) -> Image.Image:
    header, _, payload = data_url.partition(",")
    assert header == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(payload)))


def test_the_guide_request_returns_a_png_data_url(server):
    status, body = _post(server.url + "/v1/chat/completions", GUIDE_BODY)
    assert status == 200, body
    image = _png(body["choices"][0]["message"]["content"][0]["image_url"]["url"])
    assert (image.format, image.size) == ("PNG", (64, 64))


def test_the_guide_request_with_20_steps_is_a_400_naming_the_file_and_the_field(server):
    body = json.loads(json.dumps(GUIDE_BODY))
    body["extra_body"]["num_inference_steps"] = 20
    status, reply = _post(server.url + "/v1/chat/completions", body)
    assert status == 400
    error = reply["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "num_inference_steps", "contract_mismatch")
    assert LIGHTNING in error["message"] and "num_inference_steps" in error["message"]


def test_the_openai_client_generates_images_and_chats(server, client):
    assert [model.id for model in client.models.list()] == ["qwen-image"]
    result = client.images.generate(model="qwen-image", prompt="a red car", size="32x48", n=2,
                                    extra_body={"seed": 7})
    images = [Image.open(io.BytesIO(base64.b64decode(item.b64_json))) for item in result.data]
    assert [image.size for image in images] == [(32, 48), (32, 48)]
    assert images[0].tobytes() != images[1].tobytes()  # n=2 runs seeds 7 and 8
    linked = client.images.generate(model="qwen-image", prompt="a red car", size="32x48", response_format="url",
                                    extra_body={"seed": 7})
    with urllib.request.urlopen(linked.data[0].url) as reply:  # served by /view
        assert Image.open(io.BytesIO(reply.read())).tobytes() == images[0].tobytes()
    chat = client.chat.completions.create(model="qwen-image", messages=[{"role": "user", "content": "a red car"}],
                                          extra_body={"width": 32, "height": 48, "seed": 7, "true_cfg_scale": 1.0})
    part = chat.choices[0].message.content[0]
    assert _png(part["image_url"]["url"]).tobytes() == images[0].tobytes()  # the same prompt, the same image


def test_the_openai_client_runs_a_video_job(video_server):
    client = _client(video_server)
    video = client.videos.create(model="wan", prompt="a fox in the snow", size="32x32",
                                 extra_body={"num_frames": 5, "seed": 3})
    assert (video.status, video.model, video.size) == ("queued", "wan", "32x32")
    seen = set()
    deadline = time.monotonic() + 300  # by time, not by a count of polls: a quick poll loop outran the job
    while time.monotonic() < deadline:
        video = client.videos.retrieve(video.id)
        seen.add(video.status)
        if video.status in ("completed", "failed"):
            break
        time.sleep(0.05)
    assert video.status == "completed" and video.progress == 100, video.error
    content = client.videos.download_content(video.id)
    assert content.response.headers["content-type"] == "image/webp"
    clip = Image.open(io.BytesIO(content.content))
    assert (clip.n_frames, clip.size) == (5, (32, 32))
    assert seen - {"queued", "in_progress", "completed"} == set()
    chat = client.chat.completions.create(model="wan", messages=[{"role": "user", "content": "a fox"}])
    assert chat.choices[0].message.content[0]["type"] == "video_url"  # a video through chat is a link


def test_a_request_is_an_ordinary_prompt_with_history_and_websocket_progress(server):
    async def body():
        ws = Client(server.url, client_id="openai-watcher")
        try:
            await ws.connect()
            request = {**GUIDE_BODY, "client_id": "openai-watcher"}
            status, reply = await ws.post("/v1/chat/completions", request)
            assert status == 200, reply
            steps = [m["data"] for m in ws.messages if m["type"] == "progress"]
            while not steps:
                message = await ws.receive()
                if message["type"] == "progress":
                    steps.append(message["data"])
            prompt_id = steps[0]["prompt_id"]
            status, history = await ws.get(f"/history/{prompt_id}")
            assert history[prompt_id]["status"]["status_str"] == "success"
            extra = history[prompt_id]["prompt"][3]
            assert extra["lorabind_openai"]["model"] == "qwen-image" and extra["client_id"] == "openai-watcher"
        finally:
            await ws.close()

    run_async(body)


def test_an_adapter_path_outside_the_lora_folders_is_refused(server, client, tmp_path, tiny_models_root):
    outside = tmp_path / "adapter.safetensors"
    outside.write_bytes(b"x")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="qwen-image", messages=[{"role": "user", "content": "a car"}],
                                       extra_body={"lora": {"name": "mine", "path": str(outside), "scale": 1.0}})
    assert caught.value.status_code == 400 and caught.value.body["param"] == "lora.path"
    assert str(tiny_models_root) not in caught.value.body["message"]  # our folders are not shown
