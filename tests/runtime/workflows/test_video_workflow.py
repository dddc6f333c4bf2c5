"""``minimax_h3_turbo_mp4``: the tiny MiniMax-H3 Turbo run saved as one MP4 with its soundtrack (issue 32).

In ``lorabind run`` its MP4 decodes (PyAV) to the frames of the same run saved as animated WebP
(``minimax_h3_turbo_8step``: same count and size), with an AAC stream exactly as long as the video and the API
prompt in its metadata. In ``lorabind serve`` the history reports it as ComfyUI reports a saved video (``images``
+ ``animated``), ``/view`` serves it as ``video/mp4``, and the queue panel's job carries it as its preview. The
tensors themselves are compared run against serve and against the references in
``tests/runtime/test_workflow_outputs.py``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import av
import pytest
from PIL import Image, ImageSequence

import lorabind
from lorabind.nodes import NODE_CLASS_MAPPINGS
from lorabind.runtime.cli import main
from lorabind.runtime.workflow_format import to_api_prompt

pytestmark = pytest.mark.slow  # runs whole workflows and a server end to end

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"
NAME, WEBP_TWIN = "minimax_h3_turbo_mp4", "minimax_h3_turbo_8step"
FPS = 24.0


def load(name: str) -> dict:
    return json.loads((WORKFLOWS / f"{name}.api.json").read_text(encoding="utf-8"))


def run(name: str, models_root, out: Path) -> Path:
    assert main(["run", str(WORKFLOWS / f"{name}.api.json"), "--models", str(models_root), "--output", str(out)]) == 0
    return out


def webp_frames_and_size(path: Path) -> tuple[int, int, int]:
    with Image.open(path) as image:
        return sum(1 for _ in ImageSequence.Iterator(image)), *image.size


def audio_end_seconds(container) -> float:
    stream = container.streams.audio[0]
    end = max(packet.pts + packet.duration for packet in container.demux(stream) if packet.size)
    return float(end * stream.time_base)


def test_ui_form_converts_to_the_api_form(mm_registry):
    converted, detected = to_api_prompt(json.loads((TEMPLATES / f"{NAME}.json").read_text()), NODE_CLASS_MAPPINGS)
    assert detected == "ui"
    assert {k: (v["class_type"], v["inputs"]) for k, v in converted.items()} == {
        k: (v["class_type"], v["inputs"]) for k, v in load(NAME).items()}


def test_the_mp4_holds_the_webp_runs_frames_and_a_soundtrack_as_long(mm_root, tmp_path, capsys):
    (webp,) = run(WEBP_TWIN, mm_root, tmp_path / "webp").rglob("*.webp")
    out = run(NAME, mm_root, tmp_path / "mp4")
    (mp4,) = out.rglob("*.mp4")
    assert mp4.relative_to(out).as_posix() == "lorabind/minimax_h3_turbo_mp4_00001_.mp4"
    assert not list(out.rglob("*.wav"))  # the soundtrack is inside, not beside it
    with av.open(str(mp4)) as container:
        video = container.streams.video[0]
        assert (video.codec_context.name, video.codec_context.pix_fmt) == ("h264", "yuv420p")
        decoded = list(container.decode(video=0))
        metadata = dict(container.metadata)
    frames = len(decoded)
    assert (frames, decoded[0].width, decoded[0].height) == webp_frames_and_size(webp) == (5, 32, 32)
    with av.open(str(mp4)) as container:
        sound = container.streams.audio[0]
        assert (sound.codec_context.name, sound.channels, sound.rate) == ("aac", 2, 48000)
        assert audio_end_seconds(container) == pytest.approx(frames / FPS, abs=1e-4)
    assert json.loads(metadata["prompt"]) == load(NAME)
    for folder in (tmp_path, mm_root):
        assert str(folder) not in mp4.read_bytes().decode("latin-1")


def serve_prompt(url: str, prompt: dict, workflow: dict, timeout: float = 300.0) -> tuple[str, dict]:
    body = {"prompt": prompt, "extra_data": {"extra_pnginfo": {"workflow": workflow}}}
    request = urllib.request.Request(f"{url}/prompt", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        prompt_id = json.load(response)["prompt_id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/history/{prompt_id}") as response:
            history = json.load(response)
        if prompt_id in history:
            return prompt_id, history[prompt_id]
        time.sleep(0.1)
    raise AssertionError(f"prompt {prompt_id} did not finish within {timeout} s")


def test_serve_reports_views_and_previews_the_mp4(mm_root, tmp_path):
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.in_process_server import BackgroundServer

    workflow = json.loads((TEMPLATES / f"{NAME}.json").read_text(encoding="utf-8"))
    server = BackgroundServer(ServerConfig(port=0, models_root=str(mm_root), output_dir=str(tmp_path / "output"),
                                           input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))).start()
    try:
        prompt_id, entry = serve_prompt(server.url, load(NAME), workflow)
        assert entry["status"]["status_str"] == "success", entry["status"]
        saved = {"filename": "minimax_h3_turbo_mp4_00001_.mp4", "subfolder": "lorabind", "type": "output"}
        assert entry["outputs"]["8"] == {"images": [saved], "animated": [True]}  # as ComfyUI's SaveVideo reports
        with urllib.request.urlopen(f"{server.url}/view?filename={saved['filename']}&subfolder=lorabind"
                                    "&type=output") as response:
            assert response.headers["Content-Type"] == "video/mp4"
            data = response.read()
        with urllib.request.urlopen(f"{server.url}/api/jobs/{prompt_id}") as response:
            job = json.load(response)
        assert job["preview_output"] == {**saved, "nodeId": "8", "mediaType": "images"}
    finally:
        server.stop()
    served = tmp_path / "served.mp4"
    served.write_bytes(data)
    with av.open(str(served)) as container:
        metadata = dict(container.metadata)
    assert json.loads(metadata["workflow"]) == workflow and json.loads(metadata["prompt"]) == load(NAME)
