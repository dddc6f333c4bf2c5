"""What the served editor opens on (issue 30): never ComfyUI's default graph, whose core nodes this server does
not have (red nodes, "Missing Node Packs", advice to install ComfyUI and its manager), but our main example.

From a fresh state folder: the first load, a reload, and a second browser context (no storage shared) each show
``wan22_lightx2v_4step`` with only node types the server registered, no missing-node dialog and no warning
toast. Screenshots go to ``tmp_path`` and the git-ignored ``test-artifacts/``."""

from __future__ import annotations

import json

import test_server_frontend_browser
from test_server_frontend_browser import (
    APP_READY,
    CHROMIUM,
    RECORD_TOASTS_AND_DIALOGS,
    TEMPLATES,
    TIMEOUT_MS,
    _bad_toasts,
    _keep_screenshot,
    sync_playwright,
)

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer

pytestmark = test_server_frontend_browser.pytestmark  # the browser tests' marks: slow, skipped without chromium

MAIN_EXAMPLE = "wan22_lightx2v_4step"
CANVAS_STATE = """() => ({
  types: app.graph.nodes.map(n => n.type),
  unregistered: app.graph.nodes.map(n => n.type).filter(t => !(t in LiteGraph.registered_node_types)),
  settings: [app.extensionManager.setting.get('Comfy.TutorialCompleted'),
             app.extensionManager.setting.get('Comfy.Notification.ShowVersionUpdates')],
})"""


def _open_and_check(context, url: str, tmp_path, artifacts, shot: str) -> dict:
    page = context.new_page()
    page.set_viewport_size({"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.add_init_script(RECORD_TOASTS_AND_DIALOGS)
    page.goto(url)
    page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)
    page.wait_for_function("() => app.graph.nodes.some(n => n.type === 'WanMoELoRAPair')", timeout=TIMEOUT_MS)
    page.wait_for_timeout(1500)  # the frontend's missing-node/model checks run after the load settles
    state = page.evaluate(CANVAS_STATE)
    state["dialogs"] = page.evaluate("window.__seen.dialogs")
    state["bad_toasts"], state["errors"] = _bad_toasts(page), errors
    _keep_screenshot(page, tmp_path, artifacts, shot)
    state["page"] = page
    return state


def test_every_visit_opens_the_main_example_not_comfyuis_default_graph(tiny_models_root, tmp_path, pytestconfig):
    artifacts = pytestconfig.rootpath / "test-artifacts"
    expected = sorted(node["type"] for node in
                      json.loads((TEMPLATES / f"{MAIN_EXAMPLE}.json").read_text(encoding="utf-8"))["nodes"])
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"),
                          state_dir=str(tmp_path / "fresh-state"))
    with BackgroundServer(config) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        first_context = browser.new_context()
        visits = {"first load": _open_and_check(first_context, server.url + "/", tmp_path, artifacts,
                                                "editor-start-first-load.png")}
        page = visits["first load"]["page"]
        page.reload()
        page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)
        visits["reload"] = _open_and_check(first_context, server.url + "/", tmp_path, artifacts,
                                           "editor-start-reload.png")
        visits["second context"] = _open_and_check(browser.new_context(), server.url + "/", tmp_path, artifacts,
                                                   "editor-start-second-context.png")
        browser.close()
    for visit, state in visits.items():
        assert sorted(state["types"]) == expected, visit
        assert state["unregistered"] == [], visit
        assert not any("Missing" in text or "ComfyUI" in text for text in state["dialogs"]), (visit, state["dialogs"])
        assert state["bad_toasts"] == [] and state["errors"] == [], visit
        assert state["settings"] == [True, False], visit  # no first-run dialog; no release news from outside
