"""Our sampler's live previews inside real ComfyUI (each version of ``real_comfyui.COMFY_VERSIONS``), started with
``--preview-method latent2rgb`` (issue 56): ComfyUI's WebSocket carries one binary preview per step of the main
example, of the staged three-sampler example (each stage its own steps) and of the MiniMax-H3 example, each right
after that step's ``progress``; the legacy form to a plain client, the form naming our sampler to a client that
announces ``supports_preview_metadata``; on 0.30 a prompt's ``preview_method: none`` sends none.

Counted with our own client on ComfyUI's own socket: the previews are ComfyUI's machinery, ours only feeds it.
"""

import asyncio
import io
import json
import shutil
import struct
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
from PIL import Image

import lorabind
from real_comfyui import RealComfyUI, version_tuple

pytestmark = pytest.mark.slow

WORKFLOWS = Path(lorabind.__file__).parent / "workflows"


@pytest.fixture(scope="module")
def comfy(tmp_path_factory, tiny_models_root, mm_root, comfy_version):
    models = tmp_path_factory.mktemp("comfy_preview_models")
    for root in (tiny_models_root, mm_root):
        shutil.copytree(root, models, dirs_exist_ok=True, symlinks=True)
    with RealComfyUI(tmp_path_factory.mktemp("comfy_previews"), models, version=comfy_version,
                     env={"COMFY_ARGS": "--preview-method latent2rgb"}) as running:
        running.comfy_version = comfy_version
        yield running


def _workflow(name: str, seed: int) -> dict:
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text(encoding="utf-8"))
    for node in prompt.values():
        if "seed" in node["inputs"]:
            node["inputs"]["seed"] = seed  # a seed of its own: ComfyUI would replay another test's cached outputs
    return prompt


async def _run(url: str, prompt: dict, metadata: bool, extra_data: dict) -> tuple:
    """(the prompt's messages, text and binary, in order: ("progress", node, step) / ("preview", event type,
    metadata or image type, image), and its history entry) on a client of our own."""
    client_id, seen = uuid.uuid4().hex, []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/ws?clientId={client_id}", max_msg_size=0) as socket:
            if metadata:
                await socket.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
            body = {"prompt": prompt, "client_id": client_id, **({"extra_data": extra_data} if extra_data else {})}
            async with session.post(f"{url}/prompt", json=body) as reply:
                assert reply.status == 200, await reply.text()
                prompt_id = (await reply.json())["prompt_id"]
            deadline = time.monotonic() + 600
            while True:
                message = await socket.receive(timeout=max(1.0, deadline - time.monotonic()))
                if message.type == aiohttp.WSMsgType.BINARY:
                    kind, second = struct.unpack(">II", message.data[:8])
                    if kind == 4:
                        seen.append(("preview", kind, json.loads(message.data[8:8 + second]),
                                     message.data[8 + second:]))
                    elif kind == 1:
                        seen.append(("preview", kind, second, message.data[8:]))
                    continue  # 3: progress text
                assert message.type == aiohttp.WSMsgType.TEXT, message
                data = json.loads(message.data)
                if data["type"] == "progress" and data["data"].get("prompt_id") == prompt_id:
                    seen.append(("progress", data["data"]["node"], data["data"]["value"]))
                if data["type"] == "executing" and data["data"]["node"] is None and \
                        data["data"].get("prompt_id") == prompt_id:
                    break
        async with session.get(f"{url}/history/{prompt_id}") as reply:
            return seen, (await reply.json())[prompt_id]


def run_counting(comfy, prompt: dict, metadata: bool = False, extra_data: dict | None = None) -> tuple:
    seen, history = asyncio.run(_run(comfy.url, prompt, metadata, extra_data or {}))
    assert history["status"]["status_str"] == "success", (history["status"], comfy.log_tail())
    return seen


def _steps_each_with_a_preview(seen: list) -> list:
    """[(node, step)] of the progress messages, checking that each is followed by exactly one preview."""
    steps = []
    for index, item in enumerate(seen):
        if item[0] == "progress":
            following = seen[index + 1] if index + 1 < len(seen) else None
            assert following is not None and following[0] == "preview", f"no preview after {item}: {seen}"
            steps.append(item[1:])
    assert len([item for item in seen if item[0] == "preview"]) == len(steps)
    return steps


def test_the_main_example_sends_one_preview_per_step(comfy):
    seen = run_counting(comfy, _workflow("wan22_lightx2v_4step", seed=601))
    assert _steps_each_with_a_preview(seen) == [("6", 1), ("6", 2), ("6", 3), ("6", 4)]
    previews = [item for item in seen if item[0] == "preview"]
    assert {(kind, image_type) for _, kind, image_type, _ in previews} == {(1, 1)}  # PREVIEW_IMAGE, JPEG
    # latent2rgb's picture of the 32x32 video's 4x4 latent, fitted by ComfyUI into its --preview-size (512)
    assert Image.open(io.BytesIO(previews[-1][3])).size == (512, 512)

    seen = run_counting(comfy, _workflow("wan22_lightx2v_4step", seed=602), metadata=True)
    previews = [item for item in seen if item[0] == "preview"]
    assert [(kind, meta["node_id"], meta["display_node_id"]) for _, kind, meta, _ in previews] == [(4, "6", "6")] * 4


def test_the_staged_samplers_and_minimax_preview_every_step_they_run(comfy):
    seen = run_counting(comfy, _workflow("wan22_lightning_three_stage", seed=603))
    assert _steps_each_with_a_preview(seen) == [("7", 1), ("8", 1), ("9", 1), ("9", 2)]
    seen = run_counting(comfy, _workflow("minimax_h3_turbo_4step_768p", seed=604))
    assert _steps_each_with_a_preview(seen) == [("6", step) for step in (1, 2, 3, 4)]


def test_a_prompt_asking_for_no_previews_gets_none_on_0_30(comfy):
    if version_tuple(comfy.comfy_version) < (0, 30):
        pytest.skip("ComfyUI 0.3.64 has no per-prompt preview method")
    seen = run_counting(comfy, _workflow("wan22_lightx2v_4step", seed=605), extra_data={"preview_method": "none"})
    assert [item for item in seen if item[0] == "preview"] == []
    assert seen[-1] == ("progress", "6", 4)  # (0.30 sends fewer plain progress messages: it throttles them)
