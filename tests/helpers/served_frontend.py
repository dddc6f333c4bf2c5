"""Shared by the tests that drive the real ComfyUI frontend ``lorabind serve`` hosts in headless Chromium: what
they need and the marks that skip them (with the reason) when it is missing, and the page's "ready" condition.

Playwright drives Debian's ``chromium`` (``executable_path``): no browser is downloaded. CI installs chromium,
playwright (the test extra) and the frontend (the ui extra)."""

from __future__ import annotations

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
