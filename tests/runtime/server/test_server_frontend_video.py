"""The MP4 of ``minimax_h3_turbo_mp4`` in the real ComfyUI frontend that ``lorabind serve`` hosts (issue 32).

Run from the Run button, the job's preview in the queue panel is the MP4, played by a ``<video>`` element (the
frontend tells a video by its suffix); then, with another workflow open, the MP4 is opened through the
frontend's own file input (``#comfy-file-input``, what "Open" and a drop both reach: ``app.handleFile``), which
reads the workflow from the file's ``moov/udta/meta`` and restores the graph; a WebM from the same saver
restores it from its Matroska tags. A file without that metadata would instead add a LoadVideo node, which the
test would see. Screenshots go to ``tmp_path`` and ``test-artifacts/``.
"""

from __future__ import annotations

import json
import time

import torch
from test_server_frontend_browser import (  # noqa: F401
    CHROMIUM,
    TIMEOUT_MS,
    _bad_toasts,
    _jobs,
    _keep_screenshot,
    _load,
    _open,
    _start,
    pytestmark,
    sync_playwright,
)

from lorabind.loaders.io.video_files import VIDEO_FORMATS, write_video
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.config import PACK_DIR

NAME = "minimax_h3_turbo_mp4"
OUTPUT = "minimax_h3_turbo_mp4_00001_.mp4"
GRAPH = "() => app.graph.nodes.map(n => [n.id, n.type]).sort((a, b) => a[0] - b[0])"


def test_the_mp4_previews_in_the_queue_and_reopens_its_workflow(mm_root, tmp_path, pytestconfig):
    workflow = json.loads((PACK_DIR / "example_workflows" / f"{NAME}.json").read_text(encoding="utf-8"))
    server = _start(ServerConfig(port=0, models_root=str(mm_root), output_dir=str(tmp_path / "output"),
                                 input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp")))
    artifacts = pytestconfig.rootpath / "test-artifacts"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page, errors = _open(browser, server.url + "/")
            _load(page, NAME)
            expected_graph = page.evaluate(GRAPH)
            assert [node_type for _, node_type in expected_graph].count("LoraBindSaveVideo") == 1
            page.click('[data-testid="queue-button"]')
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            while not (done := _jobs(server, "completed,failed,cancelled")) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert [job["status"] for job in done] == ["completed"], done
            history = page.evaluate("window.comfyAPI.api.api.getHistory(10)")
            assert [job["preview_output"]["filename"] for job in history] == [OUTPUT]
            page.wait_for_selector(f'video[src*="filename={OUTPUT}"], video source[src*="filename={OUTPUT}"]',
                                   state="attached", timeout=TIMEOUT_MS)
            _keep_screenshot(page, tmp_path, artifacts, "frontend-mp4-after-run.png")

            page.evaluate("() => app.graph.clear()")  # another (empty) graph is open when the file comes in
            assert page.evaluate(GRAPH) == []
            page.set_input_files("#comfy-file-input", str(tmp_path / "output" / "lorabind" / OUTPUT))
            page.wait_for_function("() => app.graph.nodes.length > 0", timeout=TIMEOUT_MS)
            assert page.evaluate(GRAPH) == expected_graph  # not a LoadVideo: the workflow came from the metadata
            reopened = page.evaluate("() => app.graph.serialize()")
            assert reopened["id"] == workflow["id"]
            assert {n["id"]: n["widgets_values"] for n in reopened["nodes"] if n["type"] == "LoraBindSaveVideo"} == \
                {8: ["lorabind/minimax_h3_turbo_mp4", 24.0, "mp4 (h264 + aac)", 19, "medium"]}
            _keep_screenshot(page, tmp_path, artifacts, "frontend-mp4-reopened.png")

            # the WebM format: its Matroska tags reopen the same workflow
            webm = tmp_path / "reopen.webm"
            write_video(str(webm), torch.rand(3, 16, 16, 3), 8.0, VIDEO_FORMATS["webm (vp9 + opus)"], 30,
                        "ultrafast", metadata={"prompt": {}, "workflow": reopened})
            page.evaluate("() => app.graph.clear()")
            page.set_input_files("#comfy-file-input", str(webm))
            page.wait_for_function("() => app.graph.nodes.length > 0", timeout=TIMEOUT_MS)
            assert page.evaluate(GRAPH) == expected_graph
            assert _bad_toasts(page) == [] and errors == []
            browser.close()
    finally:
        server.stop()
