"""Headless Chromium on the ComfyUI frontend ``lorabind serve`` hosts (issue 56): Run on the main example with the
server's default previews (latent2rgb, at most one every 100 ms, the last step always) and the frontend, which
announces ``supports_preview_metadata``, gets the sampler's previews in the metadata form and shows the last one on
the sampler node. A screenshot of the node is kept in ``tmp_path`` and in the git-ignored ``test-artifacts/``.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import numpy as np
from PIL import Image

from lorabind.runtime.server.config import PACK_DIR
from lorabind.runtime.server.in_process_server import BackgroundServer
from served_frontend import FRONTEND_MARKS, served_editor

pytestmark = FRONTEND_MARKS
TIMEOUT_MS = 120_000  # page start and a run on a loaded 2-core machine; both take seconds when it is idle
SAMPLER = 6  # the main example's LoraBindSampler

RECORD_PREVIEWS = """() => window.comfyAPI.api.api.addEventListener('b_preview_with_metadata',
    event => window.__previews.push([event.detail.displayNodeId, event.detail.jobId, event.detail.blob.type]))"""
# the sampler node as drawn: its preview picture and whether it is the one the frontend keeps for the node, and
# where the node is on the page
SAMPLER_NODE = """(id) => {
    const node = app.graph.getNodeById(id);
    const image = node.imgs && node.imgs[0];
    const top = app.canvasPosToClientPos([node.pos[0], node.pos[1] - LiteGraph.NODE_TITLE_HEIGHT]);
    const bottom = app.canvasPosToClientPos([node.pos[0] + node.size[0], node.pos[1] + node.size[1]]);
    return {width: image ? image.naturalWidth : 0, kept: !!image && (app.nodePreviewImages[String(id)] || [])
            .includes(image.src), box: [top[0], top[1], bottom[0] - top[0], bottom[1] - top[1]]};
}"""


def test_the_sampler_node_shows_its_live_preview_in_the_served_editor(tiny_models_root, tmp_path, pytestconfig):
    viewport = {"width": 1400, "height": 1300}
    with served_editor(tiny_models_root, tmp_path, viewport, TIMEOUT_MS, "window.__previews = [];") as (server, page):
        page.evaluate(RECORD_PREVIEWS)
        workflow = json.loads((PACK_DIR / "workflows" / "wan22_lightx2v_4step.json").read_text(encoding="utf-8"))
        page.evaluate("([wf, name]) => app.loadGraphData(wf, true, true, name)", [workflow, "main example"])
        page.click('[data-testid="queue-button"]')
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while not (jobs := _finished_jobs(server)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert [job["status"] for job in jobs] == ["completed"], jobs
        # /api/jobs may say "completed" before the page has read the last frames off its WebSocket
        page.wait_for_function("window.__previews.length >= 2", timeout=TIMEOUT_MS)
        previews = page.evaluate("window.__previews")
        # the first and the last step at least (the others when 100 ms had passed), all on the sampler
        assert 2 <= len(previews) <= 4
        assert {tuple(preview) for preview in previews} == {(str(SAMPLER), jobs[0]["id"], "image/jpeg")}
        page.wait_for_function(f"({SAMPLER_NODE})({SAMPLER}).kept", timeout=TIMEOUT_MS)
        node = page.evaluate(f"({SAMPLER_NODE})({SAMPLER})")
        assert node["width"] == 512  # the 4x4 latent's picture, fitted into the preview size as ComfyUI does
        shot = tmp_path / "frontend-sampler-preview.png"
        x, y, width, height = node["box"]
        page.screenshot(path=str(shot), clip={"x": x, "y": y, "width": width, "height": height})
        artifacts = pytestconfig.rootpath / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        shutil.copy(shot, artifacts / shot.name)
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    picture = pixels[int(pixels.shape[0] * 0.7):]  # the node's bottom part, under its widgets: the preview
    # measured: 15,362 colours there with the preview, 450 (the widgets' text) without one
    assert len({tuple(p) for p in picture.reshape(-1, 3)}) > 2000, "no preview picture drawn on the sampler node"


def _finished_jobs(server: BackgroundServer) -> list:
    with urllib.request.urlopen(f"{server.url}/api/jobs?status=completed,failed,cancelled") as reply:
        return json.load(reply)["jobs"]
