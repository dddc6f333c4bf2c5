"""The frontend we serve (comfyui-frontend-package 1.58.1) still exports the mute/bypass cases as the fixture says.

``tests/runtime/frontend_exports_1.58.1.json`` was captured here: each case of
``ui_workflow_builders.frontend_export_cases`` loaded into the real frontend (served with the fake runtime nodes)
and exported with ``app.graphToPrompt()``. ``test_workflow_format_frontend.py`` holds our conversion to it; this
test holds the fixture to the frontend, so a frontend upgrade that changes the rules fails here first.
``LORABIND_RECAPTURE_FRONTEND_EXPORTS=1`` rewrites the fixture instead (read the diff before committing it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from test_server_frontend_browser import CHROMIUM, TIMEOUT_MS, pytestmark, sync_playwright  # noqa: F401

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from runtime_fake_nodes import FAKE_NODES
from ui_workflow_builders import frontend_export_cases

FIXTURE = Path(__file__).parents[1] / "frontend_exports_1.58.1.json"
EXPORT = "async ([wf]) => { await app.loadGraphData(wf, true, true, 'case'); return (await app.graphToPrompt()).output; }"


def test_the_served_frontend_exports_each_mode_case_as_captured(tmp_path):
    config = ServerConfig(port=0, models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))
    with BackgroundServer(config, node_classes=FAKE_NODES) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_function("!!(window.app && window.app.graph && LiteGraph.registered_node_types.RtSeeded)",
                               timeout=TIMEOUT_MS)
        exported = {case: page.evaluate(EXPORT, [workflow]) for case, workflow in frontend_export_cases().items()}
        browser.close()
    document = json.loads(FIXTURE.read_text(encoding="utf-8"))
    if os.environ.get("LORABIND_RECAPTURE_FRONTEND_EXPORTS") == "1":
        document["exports"] = exported
        FIXTURE.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    assert exported == document["exports"]
