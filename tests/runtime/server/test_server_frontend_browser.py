"""Headless Chromium on the real ComfyUI frontend that ``lorabind serve`` hosts (the ``ui`` extra).

One user session, in order: the page opens without error toasts, with our examples among the templates and our
nodes registered; ``wan22_mismatched_contract`` shows the steps conflict on the sampler before anything is
queued; ``wan22_lightx2v_4step`` runs from the Run button and its output reaches the queue/history panel; the
workflow is saved under a new name through the frontend's Save dialog, and after a server restart on the same
state folder the new page lists it and opens it. Screenshots of the canvas are kept in ``tmp_path`` and in the git-ignored
``test-artifacts/`` folder of the pytest root (the repository).

Playwright drives Debian's ``chromium`` (``executable_path``): no browser is downloaded. Skips with the reason
when chromium, playwright or the ui extra is missing; CI installs all three.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.config import PACK_DIR
from lorabind.runtime.server.in_process_server import BackgroundServer
from served_frontend import APP_READY, CHROMIUM, FRONTEND_MARKS, sync_playwright

pytestmark = FRONTEND_MARKS
TEMPLATES = PACK_DIR / "workflows"
SAVED_NAME = "my edited wan22"
TIMEOUT_MS = 120_000  # page start and a run on a loaded 2-core machine; both take seconds when it is idle

# Every toast and dialog the page shows, recorded as it appears (toasts close themselves after a while).
RECORD_TOASTS_AND_DIALOGS = """
window.__seen = {toasts: [], dialogs: []};
new MutationObserver(() => {
  for (const el of document.querySelectorAll('[data-testid="toast"], [role="dialog"]')) {
    if (el.__recorded) continue;
    el.__recorded = true;
    const text = (el.innerText || '').slice(0, 300);
    if (el.matches('[role="dialog"]')) window.__seen.dialogs.push(text);
    else window.__seen.toasts.push([el.dataset.toastKind, text]);
  }
}).observe(document, {childList: true, subtree: true});
"""


def _start(config: ServerConfig) -> BackgroundServer:
    return BackgroundServer(config).start()


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.add_init_script(RECORD_TOASTS_AND_DIALOGS)
    page.goto(url)
    page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)
    return page, errors


def _load(page, name: str) -> None:
    workflow = json.loads((TEMPLATES / f"{name}.json").read_text(encoding="utf-8"))
    page.evaluate("([wf, name]) => app.loadGraphData(wf, true, true, name)", [workflow, name])


def _jobs(server: BackgroundServer, statuses: str) -> list[dict]:
    with urllib.request.urlopen(f"{server.url}/api/jobs?status={statuses}") as reply:
        return json.load(reply)["jobs"]


def _keep_screenshot(page, tmp_path: Path, artifacts: Path, name: str) -> Path:
    shot = tmp_path / name
    page.locator("#graph-canvas").screenshot(path=str(shot))
    artifacts.mkdir(exist_ok=True)
    shutil.copy(shot, artifacts / name)
    return shot


def _bad_toasts(page) -> list:
    return [toast for toast in page.evaluate("window.__seen.toasts") if toast[0] in ("error", "warning")]


def test_edit_run_save_and_reopen_in_the_served_frontend(tiny_models_root, tmp_path, pytestconfig):
    from PIL import Image

    artifacts = pytestconfig.rootpath / "test-artifacts"

    def config() -> ServerConfig:  # the same folders (and so the same state folder) for both starts
        return ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(tmp_path / "output"),
                            input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))

    server = _start(config())
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page, errors = _open(browser, server.url + "/")

            # a first visit opens our main example (test_server_frontend_start.py); the template browser lists
            # our examples as the "lorabind" templates
            page.evaluate("() => { app.extensionManager.command.execute('Comfy.BrowseTemplates'); }")
            page.wait_for_selector('[role="dialog"]:has-text("lorabind")', timeout=TIMEOUT_MS)
            page.keyboard.press("Escape")
            page.wait_for_selector('[role="dialog"]', state="detached")
            registered = page.evaluate("Object.keys(LiteGraph.registered_node_types)")
            assert {"LoraBindSampler", "FuseDistillLoRA", "WanMoELoRAPair", "LoraBindModelLoader",
                    "LoraBindSaveImage"} <= set(registered)

            # the contract conflict shows on the sampler while editing, before anything is queued
            _load(page, "wan22_mismatched_contract")
            warning = page.wait_for_selector('.lorabind-warning:has-text("steps 20 ≠ 4 required by")',
                                             timeout=TIMEOUT_MS)
            assert "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors" in warning.inner_text()
            assert _jobs(server, "pending,in_progress,completed,failed,cancelled") == []
            shot = _keep_screenshot(page, tmp_path, artifacts, "frontend-mismatched-contract.png")
            assert len(Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)) > 50, "blank screenshot"

            # Run (the queue button) on the main example; the output reaches the queue/history panel
            _load(page, "wan22_lightx2v_4step")
            page.click('[data-testid="queue-button"]')
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            while not (done := _jobs(server, "completed,failed,cancelled")) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert [job["status"] for job in done] == ["completed"], done
            output = "wan22_lightx2v_4step_00001_.webp"
            history = page.evaluate("window.comfyAPI.api.api.getHistory(10)")
            assert [job["preview_output"]["filename"] for job in history] == [output]
            page.wait_for_selector(f'img[src*="filename={output}"]', timeout=TIMEOUT_MS)
            assert page.evaluate("app.extensionManager.lastExecutionError") is None
            _keep_screenshot(page, tmp_path, artifacts, "frontend-after-run.png")

            # save under a new name through the frontend's own Save dialog
            page.evaluate("() => { app.extensionManager.command.execute('Comfy.SaveWorkflowAs'); }")
            name_input = page.wait_for_selector('[role="dialog"] input', timeout=TIMEOUT_MS)
            name_input.fill(SAVED_NAME)
            name_input.press("Enter")
            saved = Path(server.config.state_dir, "userdata", "workflows", f"{SAVED_NAME}.json")
            deadline = time.monotonic() + 30
            while not saved.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert [n["type"] for n in json.loads(saved.read_text())["nodes"]].count("LoraBindSampler") == 1
            assert _bad_toasts(page) == [] and errors == []
            dialogs = page.evaluate("window.__seen.dialogs")
            assert [text.split("\n", 1)[0] for text in dialogs] == ["Templates", "Save workflow"], dialogs
            page.close()

            server.stop()
            server = _start(config())  # a new port: a new origin, so nothing comes from the browser's storage
            page, errors = _open(browser, server.url + "/")
            page.wait_for_function(
                "path => app.extensionManager.workflow.persistedWorkflows.some(w => w.path === path)",
                arg=f"workflows/{SAVED_NAME}.json", timeout=TIMEOUT_MS)
            page.keyboard.press("Escape")
            page.evaluate("() => app.extensionManager.command.execute('Workspace.ToggleSidebarTab.workflows')")
            page.click(f'text="{SAVED_NAME}"', timeout=TIMEOUT_MS)  # open it from the Workflows sidebar
            # the opened workflow becomes the active one (the start graph holds the same node types, so waiting
            # for a node proves nothing: under load the click's workflow arrives later)
            page.wait_for_function("path => app.extensionManager.workflow.activeWorkflow?.path === path",
                                   arg=f"workflows/{SAVED_NAME}.json", timeout=TIMEOUT_MS)
            assert page.evaluate("app.graph.nodes.some(n => n.type === 'WanMoELoRAPair')")
            assert _bad_toasts(page) == [] and errors == []
            browser.close()
    finally:
        server.stop()
