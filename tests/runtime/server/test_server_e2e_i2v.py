"""The image-to-video example as one API prompt with ComfyUI's LoadImage: it runs in `lorabind run` and in
`lorabind serve` (start image uploaded through /upload/image) and both give the same frames; every i2v example
workflow's UI form, and the Qwen-Image-Edit one's, converts to its API form with the runtime's node set (LoadImage
included)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image, ImageSequence

from lorabind.runtime.cli import main
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.config import PACK_DIR
from lorabind.runtime.server.in_process_server import BackgroundServer
from server_client import Client, run_async

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

WORKFLOWS = PACK_DIR / "workflows" / "api"
TEMPLATES = PACK_DIR / "workflows"
# the examples that start from input images (ComfyUI's LoadImage): image-to-video, VACE, and Qwen-Image-Edit
I2V_EXAMPLES = ("wan22_i2v_lightx2v_4step", "wan21_i2v", "wan22_ti2v", "wan21_vace_control",
                "qwen_image_edit_lightning")


def _frames(path) -> list:
    with Image.open(path) as picture:
        return [np.array(frame.convert("RGB")) for frame in ImageSequence.Iterator(picture)]


@pytest.mark.parametrize("name", I2V_EXAMPLES)
def test_ui_form_converts_to_the_api_form_with_comfyuis_load_image(name):
    from lorabind.runtime.core_nodes import runtime_node_classes
    from lorabind.runtime.workflow_format import to_api_prompt

    classes, names = runtime_node_classes()
    converted, kind = to_api_prompt(json.loads((TEMPLATES / f"{name}.json").read_text()), classes, names)
    api = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    assert kind == "ui"
    assert {k: (v["class_type"], v["inputs"]) for k, v in converted.items()} == {
        k: (v["class_type"], v["inputs"]) for k, v in api.items()}
    assert any(node["class_type"] == "LoadImage" and node["inputs"]["image"] == "lorabind-tiny/start.png"
               for node in api.values())


def test_the_same_prompt_runs_in_lorabind_run_and_lorabind_serve(tmp_path, capsys):
    workflow = WORKFLOWS / "wan22_i2v_lightx2v_4step.api.json"
    folders = ["--models", str(tmp_path / "models"), "--input", str(tmp_path / "input")]
    assert main(["run", str(workflow), "--output", str(tmp_path / "run"), *folders]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "boundary=0.875 experts: transformer transformer transformer transformer_2" in out  # vllm-omni recipe
    assert "bind: 2 LoRA(s) fused" in out
    (from_run,) = (tmp_path / "run" / "lorabind").glob("wan22_i2v_lightx2v_4step_*.webp")
    start = tmp_path / "input" / "lorabind-tiny" / "start.png"  # drawn on first use by `lorabind run`

    prompt = json.loads(workflow.read_text())
    loader = next(nid for nid, node in prompt.items() if node["class_type"] == "LoadImage")
    config = ServerConfig(port=0, models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "serve"),
                          input_dir=str(tmp_path / "uploads"), temp_dir=str(tmp_path / "temp"))
    server = BackgroundServer(config).start()

    async def body():
        import aiohttp

        client = Client(server.url)
        try:
            await client.connect()
            form = aiohttp.FormData()
            form.add_field("image", start.read_bytes(), filename="start.png", content_type="image/png")
            form.add_field("subfolder", "mine")
            status, uploaded = await client.post("/upload/image", form)
            assert status == 200 and uploaded == {"name": "start.png", "subfolder": "mine", "type": "input"}
            prompt[loader]["inputs"]["image"] = "mine/start.png"
            pid = (await client.queue_prompt(prompt))["prompt_id"]
            seen = await client.wait_done(pid, timeout=600)
            assert seen[-2]["type"] == "execution_success", seen[-2]
            _, info = await client.get("/object_info/LoadImage")
            return info["LoadImage"]
        finally:
            await client.close()

    try:
        load_image_info = run_async(body)
    finally:
        server.stop()
    assert load_image_info["python_module"] == "nodes" and load_image_info["output"] == ["IMAGE", "MASK"]
    (from_serve,) = (tmp_path / "serve" / "lorabind").glob("wan22_i2v_lightx2v_4step_*.webp")
    run_frames, serve_frames = _frames(from_run), _frames(from_serve)
    assert len(run_frames) == 5 and all(np.array_equal(a, b) for a, b in zip(run_frames, serve_frames))
