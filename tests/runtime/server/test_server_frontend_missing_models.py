"""The served ComfyUI frontend (1.58.1, the ui extra) offers a real workflow's missing files for download, because its
loader nodes carry ``properties.models`` (issue 55).

``workflows/real/wan22_t2v_a14b_lightx2v.json`` opened on an empty models folder: the frontend reports the six
files as missing models and lists each with its folder, a Download button and its URL ("Copy URL"), in 1.58 the
"Missing Models" list of the Issues panel that its "issues found" notice opens (the missing-models dialog of older
frontends). The screenshot goes to ``tmp_path`` and the git-ignored ``test-artifacts/``.

No request leaves loopback: the frontend would ask each URL for the file's size (HEAD) and api.comfy.org about
node packs, but the page's Content-Security-Policy (``default-src 'self'``) stops them in the browser, so the
list shows no sizes; the browser context would also abort any request to another host, and none reaches it.
Playwright drives Debian's ``chromium``; skips with the reason when chromium, playwright or the ui extra is missing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.config import PACK_DIR
from lorabind.runtime.server.in_process_server import BackgroundServer
from served_frontend import APP_READY, CHROMIUM, FRONTEND_MARKS, sync_playwright

pytestmark = FRONTEND_MARKS
WORKFLOW = PACK_DIR / "workflows" / "real" / "wan22_t2v_a14b_lightx2v.json"
TIMEOUT_MS = 120_000  # page start on a loaded 2-core machine; seconds when it is idle
# what "Copy URL" copies, kept instead of touching the system clipboard
RECORD_COPIES = """
window.__copied = [];
Object.defineProperty(navigator, 'clipboard', {configurable: true, value: {
  writeText: async text => { window.__copied.push(text); }, readText: async () => window.__copied.at(-1) || '',
  write: async () => {}}});
"""
NOT_LOOPBACK = re.compile(r"^https?://(?!127\.0\.0\.1[:/])")


def test_the_editor_lists_a_real_workflows_missing_files_with_their_urls(tmp_path, pytestconfig):
    declared = [entry for node in json.loads(WORKFLOW.read_text())["nodes"]
                for entry in node.get("properties", {}).get("models", [])]
    assert len(declared) == 6
    config = ServerConfig(port=0, models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))
    server = BackgroundServer(config).start()
    stopped = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.route(NOT_LOOPBACK, lambda route: (stopped.append((route.request.method, route.request.url)),
                                                       route.abort()))
            page = context.new_page()
            page.add_init_script(RECORD_COPIES)
            page.goto(server.url + "/")
            page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)
            page.evaluate("([wf, name]) => app.loadGraphData(wf, true, true, name)",
                          [json.loads(WORKFLOW.read_text()), WORKFLOW.stem])

            page.get_by_text("6 issues found").wait_for(timeout=TIMEOUT_MS)
            page.get_by_text("View details").click()
            page.get_by_text("Missing Models").wait_for(timeout=TIMEOUT_MS)
            downloads = page.locator('button[aria-label^="Download "]')
            downloads.nth(5).wait_for(timeout=TIMEOUT_MS)
            listed = sorted(label.removeprefix("Download ") for label in
                            (downloads.nth(i).get_attribute("aria-label") for i in range(downloads.count())))
            assert listed == sorted(entry["name"] for entry in declared)
            shot = tmp_path / "frontend-missing-models.png"
            page.screenshot(path=str(shot))
            artifacts = pytestconfig.rootpath / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            shutil.copy(shot, artifacts / shot.name)

            for button in page.locator('button[aria-label="Copy URL"]').all():
                button.click()
            copied = page.evaluate("window.__copied")
            browser.close()
    finally:
        server.stop()
    # the frontend copies the file's page: the same URL with /blob/ for /resolve/
    assert sorted(copied) == sorted(entry["url"].replace("/resolve/", "/blob/") for entry in declared)
    assert stopped == []  # the page's policy stopped the size requests before they reached the network
    assert Path(shot).stat().st_size > 10_000
