"""Run on a refused workflow shows why (issue 45): the 400's node error is worded by frontend 1.58.1 with our
text, in the toast that Run raises and in the Issues panel, not as "an unrecognized validation error".

``wan22_mismatched_contract`` asks 20 steps of a 4-step pair: the contract text (file name, "steps must be 4, got
20") must be in both. The same page then names a model that is not there: the toast names the missing value.
Last, the main example with its pair swapped: that is refused when the pair node runs (an ``execution_error``,
as ComfyUI sends for any failing node), which the frontend toasts in its own generic words; the Issues panel
shows our message. Screenshots go to ``tmp_path`` and the git-ignored ``test-artifacts/``."""

from __future__ import annotations

import test_server_frontend_browser
from test_server_frontend_browser import TIMEOUT_MS, _keep_screenshot, _load

from served_frontend import served_editor

pytestmark = test_server_frontend_browser.pytestmark  # the browser tests' marks: slow, skipped without chromium

CONTRACT_TEXT = "is a 4-step distill LoRA: steps must be 4, got 20"
MISSING_MODEL = "tiny-wan22-not-downloaded"
TOAST = '[data-testid="error-overlay"]'
SET_MODEL = """(name) => {
  const loader = app.graph.nodes.find(n => n.type === 'LoraBindModelLoader');
  loader.widgets.find(w => w.name === 'model_name').value = name;
}"""
SWAP_PAIR = """() => {
  const pair = app.graph.nodes.find(n => n.type === 'WanMoELoRAPair');
  const [high, low] = ['high_noise_lora', 'low_noise_lora'].map(name => pair.widgets.find(w => w.name === name));
  [high.value, low.value] = [low.value, high.value];
}"""


def _run_and_read_toast(page) -> str:
    page.click('[data-testid="queue-button"]')
    page.wait_for_selector(TOAST, timeout=TIMEOUT_MS)
    return page.locator(TOAST).inner_text()


def test_run_on_a_refused_workflow_shows_the_reason_in_the_toast_and_the_issues_panel(tiny_models_root, tmp_path,
                                                                                     pytestconfig):
    artifacts = pytestconfig.rootpath / "test-artifacts"
    with served_editor(tiny_models_root, tmp_path, {"width": 1600, "height": 1000}, TIMEOUT_MS) as (_, page):
        _load(page, "wan22_mismatched_contract")

        toast = _run_and_read_toast(page)
        _keep_screenshot(page, tmp_path, artifacts, "refused_contract_toast.png")
        assert CONTRACT_TEXT in " ".join(toast.split()), toast  # the toast wraps and may cut it short
        page.click('[data-testid="error-overlay-see-errors"]')  # the Issues panel
        page.wait_for_selector('[data-testid="error-group-execution"]', timeout=TIMEOUT_MS)
        page.click('button[aria-controls][aria-label$=" - steps"]')  # the card's details
        details = page.locator(f"p:has-text('{CONTRACT_TEXT}')")
        details.wait_for(timeout=TIMEOUT_MS)
        page.wait_for_timeout(500)  # the details open with a transition
        page.screenshot(path=str(tmp_path / "refused_contract_issues_panel.png"))
        assert "high_noise_lora_rank64_lightx2v_4step_1217.safetensors" in details.inner_text()
        panel = page.locator('[data-testid="error-group-execution"]').inner_text()
        assert "does not recognize" not in panel and "unrecognized" not in panel, panel

        page.evaluate(SET_MODEL, MISSING_MODEL)
        toast = _run_and_read_toast(page)
        page.screenshot(path=str(tmp_path / "refused_missing_model_toast.png"))
        assert MISSING_MODEL in toast, toast

        _load(page, "wan22_lightx2v_4step")
        page.evaluate(SWAP_PAIR)
        _run_and_read_toast(page)
        page.click('[data-testid="error-overlay-see-errors"]')
        page.wait_for_selector("text=the pair is swapped", timeout=TIMEOUT_MS)
        page.screenshot(path=str(tmp_path / "refused_swapped_pair_issues_panel.png"))
