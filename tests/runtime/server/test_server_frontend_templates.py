"""Every example template opens clean in the served frontend (issue 30), before any run and after a run of it.

For each template ``lorabind serve`` lists, in the real ComfyUI frontend it hosts: no red node (the frontend's
``has_errors`` flag: missing models, "Media input missing" on a LoadImage, a failed run), no missing-resource
entries, no warning or error toast, no dialog, no lorabind warning badge, no two nodes covering each other, and
every badge tall enough for its whole text (the sampler's contract line names both files of a pair). Then the
template runs from the Run button and the same holds afterwards. ``wan22_mismatched_contract`` is the exception
on purpose: before a run it shows exactly its steps warning on the sampler, in full; it is not run (it is
refused by design). Screenshots of each state go to ``tmp_path`` and the git-ignored ``test-artifacts/``.

Kept short (well under 2 minutes on 2 cores): the models root is the session's tiny models, the server renders
no template thumbnails (only ``lorabind serve`` does, at start), and one page opens every template in turn.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from test_server_frontend_browser import (  # noqa: F401
    APP_READY,
    CHROMIUM,
    RECORD_TOASTS_AND_DIALOGS,
    TIMEOUT_MS,
    _bad_toasts,
    _keep_screenshot,
    pytestmark,
    sync_playwright,
)

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.example_assets import prepare_example_assets
from lorabind.runtime.server.in_process_server import BackgroundServer

MISMATCHED = "wan22_mismatched_contract"
HIGH = "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"
LOW = HIGH.replace("high_noise", "low_noise")

# What the canvas shows now: red nodes, missing-resource entries, lorabind warnings, overlapping node boxes, and
# badges cut off (the room the frontend gives the badge is less than its lines need).
CANVAS_STATE = """async () => {
  const lorabind = await import('/extensions/lorabind/lorabind.js');
  await lorabind.lookupsSettled();
  await new Promise(requestAnimationFrame);
  app.canvas.draw(true, true);  // lays the widgets out: a node grows to fit its badge here
  const stores = document.querySelector('#vue-app').__vue_app__.config.globalProperties.$pinia._s;
  const missing = (id, key) => (stores.get(id)?.[key] || []).map(c => `${c.nodeType}: ${c.name}`);
  const title = LiteGraph.NODE_TITLE_HEIGHT;
  const boxes = app.graph.nodes.map(n => [n.id, n.pos[0], n.pos[1] - title, n.pos[0] + n.size[0], n.pos[1] + n.size[1]]);
  const overlaps = [];
  boxes.forEach((a, i) => boxes.slice(i + 1).forEach(b => {
    if (a[1] < b[3] && b[1] < a[3] && a[2] < b[4] && b[2] < a[4]) overlaps.push([a[0], b[0]]);
  }));
  const badges = app.graph.nodes.filter(n => n.lorabindBadge).map(n => {
    const widget = n.widgets.find(w => w.name === 'lorabind_badge');
    const rows = [...n.lorabindBadge.children];
    const needed = rows.reduce((sum, row) => sum + row.offsetHeight, 0) + 8;
    const given = (widget.computedHeight ?? 0) - 2 * widget.margin;
    return {node: `${n.id} ${n.type}`, lines: n.lorabindLines, warning: !!n.lorabindWarning,
            cut: needed > given + 1, tooWide: rows.some(row => row.scrollWidth > row.clientWidth + 1)};
  });
  return {
    red: app.graph.nodes.filter(n => n.has_errors).map(n => `${n.id} ${n.type}`),
    missing: [...missing('missingMedia', 'missingMediaCandidates'), ...missing('missingModel', 'missingModelCandidates')],
    overlaps, badges, boxes,
  };
}"""
# How each run ends, recorded from the frontend's own websocket events (set up once per page).
RECORD_RUN_ENDS = """() => {
  window.__runEnds = [];
  const api = window.comfyAPI.api.api;
  const record = (kind) => (event) => window.__runEnds.push([kind, event.detail?.exception_message ?? null]);
  api.addEventListener('execution_success', record('success'));
  api.addEventListener('execution_error', record('error'));
}"""


def _templates(server) -> list[str]:
    with urllib.request.urlopen(f"{server.url}/templates/index.json") as reply:
        return [card["name"] for card in json.load(reply)[0]["templates"]]


def _open_template(page, name: str) -> None:
    page.evaluate("""async (name) => {
      const reply = await fetch(`/api/workflow_templates/lorabind/${name}.json`);
      await app.loadGraphData(await reply.json(), true, true, name);
    }""", name)
    page.wait_for_timeout(300)  # the frontend's missing-model/media scans finish after the load resolves


def _look(page, tmp_path, artifacts, shot: str) -> dict:
    state = page.evaluate(CANVAS_STATE)
    state["toasts"] = _bad_toasts(page)
    state["dialogs"] = page.evaluate("window.__seen.dialogs.splice(0)")
    page.evaluate("window.__seen.toasts.splice(0)")
    _keep_screenshot(page, tmp_path, artifacts, shot)
    return state


def _problems(state: dict) -> dict:
    """Everything that should not be on a clean canvas, by kind (empty lists when clean)."""
    return {"red": state["red"], "missing": state["missing"], "overlaps": state["overlaps"],
            "toasts": state["toasts"], "dialogs": state["dialogs"],
            "warned": [b["node"] for b in state["badges"] if b["warning"]],
            "cut badges": [b["node"] for b in state["badges"] if b["cut"] or b["tooWide"]]}


@pytest.fixture
def served(build_tiny_root, tmp_path):
    """The server on the session's tiny models, with what the templates name besides them (the single-file
    set, the start/end images) prepared as ``lorabind serve`` prepares it at start."""
    prepare_example_assets(ServerConfig().workflows_dir, str(build_tiny_root), str(tmp_path / "input"),
                           announce=lambda line: None)
    config = ServerConfig(port=0, models_root=str(build_tiny_root), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"),
                          state_dir=str(tmp_path / "state"))
    with BackgroundServer(config) as server:
        yield server


def test_every_template_opens_and_runs_without_red_nodes_or_warnings(served, tmp_path, pytestconfig):
    artifacts = pytestconfig.rootpath / "test-artifacts"
    found, errors = {}, []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.add_init_script(RECORD_TOASTS_AND_DIALOGS)
        page.goto(served.url + "/")
        page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)
        page.evaluate(RECORD_RUN_ENDS)
        for name in _templates(served):
            _open_template(page, name)
            found[name] = {"before": _look(page, tmp_path, artifacts, f"template-{name}-before.png")}
            if name == MISMATCHED:
                continue
            page.click('[data-testid="queue-button"]')
            page.wait_for_function("window.__runEnds.length > 0", timeout=TIMEOUT_MS)
            found[name]["run"] = page.evaluate("window.__runEnds.pop()")
            found[name]["after"] = _look(page, tmp_path, artifacts, f"template-{name}-after.png")
        browser.close()
    (artifacts / "template-states.json").write_text(json.dumps(found, indent=1, ensure_ascii=False), encoding="utf-8")
    assert errors == []

    mismatched = found.pop(MISMATCHED)["before"]
    sampler = [b for b in mismatched["badges"] if b["node"].endswith("LoraBindSampler")]
    assert sampler == [{"node": sampler[0]["node"], "warning": True, "cut": False, "tooWide": False, "lines": [
        f"⚠ steps 20 ≠ 4 required by {HIGH}", f"⚠ steps 20 ≠ 4 required by {LOW}",
        f"contract: 4 steps · shift 5 · cfg 1 — from {HIGH}, {LOW}"]}]
    clean = {"red": [], "missing": [], "overlaps": [], "toasts": [], "dialogs": [], "warned": [], "cut badges": []}
    assert _problems(mismatched) == {**clean, "warned": [sampler[0]["node"]]}

    assert len(found) >= 10
    for name, states in found.items():
        assert states["run"] == ["success", None], name
        assert _problems(states["before"]) == clean, (name, "before any run")
        assert _problems(states["after"]) == clean, (name, "after a run")
