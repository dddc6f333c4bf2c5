"""Each example template opens at a zoom where titles and widget values are drawn (issue 45).

Frontend 1.58.1 fits every template it opens to the window; ours are wide, so in a 1600x1000 window they opened
at 53-57 %, under the zoom below which LiteGraph draws nodes as blank boxes. ``lorabind_start.js`` opens them at
their saved view (``extra.ds``) instead. Each template is opened as the template browser opens it
(``loadGraphData(..., {openSource: 'template'})``) and the scale the frontend reports is checked, with the
top-left node in view. Screenshots go to ``tmp_path`` and the git-ignored ``test-artifacts/``."""

from __future__ import annotations

import json
import urllib.request

import test_server_frontend_browser
from test_server_frontend_browser import APP_READY, CHROMIUM, TIMEOUT_MS, _keep_screenshot, sync_playwright

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer

pytestmark = test_server_frontend_browser.pytestmark  # the browser tests' marks: slow, skipped without chromium

WINDOW = {"width": 1600, "height": 1000}
READABLE_SCALE = 0.75
OPEN_AS_TEMPLATE = """async (name) => {
  const reply = await fetch(`/api/workflow_templates/lorabind/${name}.json`);
  await app.loadGraphData(await reply.json(), true, true, name, {openSource: 'template'});
  for (let frame = 0; frame < 240 && app.pendingCamera; frame++) await new Promise(requestAnimationFrame);
  for (let frame = 0; frame < 3; frame++) await new Promise(requestAnimationFrame);
  const ds = app.canvas.ds;
  const first = app.graph.nodes.reduce((a, b) => (a.pos[0] + a.pos[1] <= b.pos[0] + b.pos[1] ? a : b));
  const title = LiteGraph.NODE_TITLE_HEIGHT;
  return {scale: ds.scale, lowQualityBelow: app.canvas.low_quality_zoom_threshold ?? 0.6,
          corner: [(first.pos[0] + ds.offset[0]) * ds.scale, (first.pos[1] - title + ds.offset[1]) * ds.scale],
          canvas: [app.canvas.canvas.clientWidth, app.canvas.canvas.clientHeight]};
}"""


def test_every_template_opens_at_a_readable_zoom_with_its_top_left_in_view(tiny_models_root, tmp_path,
                                                                          pytestconfig):
    artifacts = pytestconfig.rootpath / "test-artifacts"
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))
    with BackgroundServer(config) as server:
        with urllib.request.urlopen(f"{server.url}/templates/index.json") as reply:
            templates = [card["name"] for card in json.load(reply)[0]["templates"]]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport=WINDOW)
            page.goto(server.url + "/")
            page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)
            views = {}
            for name in templates:
                views[name] = page.evaluate(OPEN_AS_TEMPLATE, name)
                _keep_screenshot(page, tmp_path, artifacts, f"template_view_{name}.png")
            browser.close()
    assert len(views) >= 20
    small = {name: round(view["scale"], 2) for name, view in views.items()
             if view["scale"] < max(READABLE_SCALE, view["lowQualityBelow"])}
    assert small == {}, f"templates that open too small to read: {small}"
    hidden = {name: view["corner"] for name, view in views.items()
              if not (0 <= view["corner"][0] < view["canvas"][0] / 2 and 0 <= view["corner"][1] < view["canvas"][1] / 2)}
    assert hidden == {}, f"templates whose top-left node opens out of view: {hidden}"
