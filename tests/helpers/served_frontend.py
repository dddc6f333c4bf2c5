"""Shared by the tests that drive the real ComfyUI frontend ``lorabind serve`` hosts in headless Chromium: what
they need and the marks that skip them (with the reason) when it is missing, and the page's "ready" condition.

Playwright drives Debian's ``chromium`` (``executable_path``): no browser is downloaded. CI installs chromium,
playwright (the test extra) and the frontend (the ui extra)."""

from __future__ import annotations

import contextlib
import shutil

import pytest

from lorabind.runtime.server.comfy_api import routes_frontend

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the test extra brings it
    sync_playwright = None

FRONTEND_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason='playwright is not installed (pip install "lorabind[test]")'),
    pytest.mark.skipif(routes_frontend.frontend_static_dir() is None,
                       reason='the ui extra is not installed (pip install "lorabind[ui]")'),
]
# the frontend has loaded, registered our nodes and built its graph
APP_READY = "!!(window.app && window.app.graph && window.LiteGraph && LiteGraph.registered_node_types.LoraBindSampler)"


@contextlib.contextmanager
def served_editor(models_root, tmp_path, viewport: dict, timeout_ms: int, before_load: str = ""):
    """``(server, page)``: ``lorabind serve`` on ``models_root`` (folders under ``tmp_path``) and Chromium on its
    editor, ready (``before_load``: a script run in the page before the frontend's own); both closed after."""
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.in_process_server import BackgroundServer

    config = ServerConfig(port=0, models_root=str(models_root), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))
    server = BackgroundServer(config).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport=viewport)
            if before_load:
                page.add_init_script(before_load)
            page.goto(server.url + "/")
            page.wait_for_function(APP_READY, timeout=timeout_ms)
            yield server, page
            browser.close()
    finally:
        server.stop()
