"""Headless Chromium: web/lorabind.js knows the contracts while a workflow is edited, before any run.

The page loads the saved ``workflows/wan22_mismatched_contract.json`` into the stub of ComfyUI's app, with the
real server (the pack's nodes, the tiny models and fixture LoRAs) answering ``/object_info`` and
``/lorabind/contract``. Skips (with the reason) when ``chromium`` is not installed; CI installs it.
"""

from __future__ import annotations

import html
import json
import re

import pytest
from test_server_browser import BROWSER_DIR, CHROMIUM, _chromium

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.config import PACK_DIR
from lorabind.runtime.server.in_process_server import BackgroundServer
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")]
HIGH, LOW = WAN22_HIGH.rsplit("/", 1)[1], WAN22_LOW.rsplit("/", 1)[1]


def _page_result(models_root, state, drive: str) -> dict:
    """Serve the pack's nodes on ``models_root`` with the extension and the test page; open the page with the
    ``drive`` module in headless Chromium and return the JSON result it leaves in the DOM."""
    srv = BackgroundServer(ServerConfig(
        port=0, models_root=str(models_root), output_dir=str(state / "output"), input_dir=str(state / "input"),
        temp_dir=str(state / "temp"),
        web_extensions={"lorabind": str(PACK_DIR / "web"), "lorabind_test": str(BROWSER_DIR)})).start()
    try:
        done = _chromium(state, "--dump-dom", f"{srv.url}/extensions/lorabind_test/index.html?drive={drive}")
    finally:
        srv.stop()
    match = re.search(r'<pre id="lorabind-result">(.*?)</pre>', done.stdout, re.S)
    assert match, f"no result block in the DOM dump; stderr: {done.stderr[-2000:]}"
    result = json.loads(html.unescape(match.group(1)))
    assert result["errors"] == []
    return result


@pytest.fixture(scope="module")
def edited(tmp_path_factory, tiny_models_root):
    return _page_result(tiny_models_root, tmp_path_factory.mktemp("editor"), "drive_editor.js")


def test_the_sampler_shows_the_steps_conflict_before_any_run(edited):
    assert edited["anyExecuted"] is False
    assert edited["samplerWarning"] is True
    # warnings first (what needs fixing is read first), then the combined contract
    # of everything upstream, naming the artifacts
    assert edited["sampler"] == [
        f"lorabind-warning: ⚠ steps 20 ≠ 4 required by {HIGH}",
        f"lorabind-warning: ⚠ steps 20 ≠ 4 required by {LOW}",
        f"lorabind-line: contract: 4 steps · shift 5 · cfg 1 — from {HIGH}, {LOW}",
    ]
    # the steps widget itself is marked, naming both artifacts; shift and cfg agree and are not
    assert edited["marked"] == {"steps": ["⚠ steps", f"steps 20 ≠ 4 required by {HIGH}; "
                                                     f"steps 20 ≠ 4 required by {LOW}"]}


def test_file_nodes_show_what_their_files_declare(edited):
    assert edited["readingPair"] == [f"lorabind-line: {WAN22_HIGH}: reading its contract…",
                                     f"lorabind-line: {WAN22_LOW}: reading its contract…"]
    assert edited["pair"] == [f"lorabind-line: {HIGH} (distill): 4 steps · shift 5 · cfg 1 — from its file name",
                              f"lorabind-line: {LOW} (distill): 4 steps · shift 5 · cfg 1 — from its file name"]
    assert edited["loader"] == ["lorabind-line: tiny-wan22-t2v: no sampling contract (its model_index.json pins "
                                "no schedule and carries no baked-in contract)"]


def test_editing_the_widgets_updates_the_warnings(edited):
    assert edited["warningsAt4"] == [] and edited["stepsLabelAt4"] in (None, "steps")
    assert edited["warningsAt0"] == []  # 0 = the step count the contract declares
    assert edited["warningsCfg"] == [f"⚠ cfg 3.5 ≠ 1 required by {HIGH}", f"⚠ cfg 3.5 ≠ 1 required by {LOW}"]
    # strength 0 switches the low-noise file and its contract off, as the sampler sees it
    assert edited["warningsLowOff"] == [f"⚠ steps 20 ≠ 4 required by {HIGH}"]
    assert f"lorabind-line: {LOW} (distill): 4 steps · shift 5 · cfg 1 — from its file name — off: " \
           "low_noise_strength is 0" in edited["pairLowOff"]
    assert edited["pairMissing"] == ["⚠ lorabind-tiny/gone.safetensors: no LoRA file or PEFT adapter folder named "
                                     "'lorabind-tiny/gone.safetensors' in the loras folder"]
    assert edited["warningsHighMissing"] == [f"⚠ steps 20 ≠ 4 required by {LOW}"]
    assert edited["warningsBack"] == [f"⚠ steps 20 ≠ 4 required by {HIGH}", f"⚠ steps 20 ≠ 4 required by {LOW}"]


def test_after_a_run_the_executed_payload_has_the_last_word(edited):
    assert edited["warningsAfterRun"] == ["⚠ steps 20 ≠ 8 required by ran.safetensors"]
    assert edited["warningsConflict"] == ["⚠ b.safetensors declares steps 8, a.safetensors 4",
                                          "⚠ steps 4 ≠ 8 required by b.safetensors"]
    assert "lorabind-line: ran: 20 steps · shift 5 · cfg 1" in edited["samplerAfterRun"]


def test_every_example_opens_without_a_warning_except_the_mismatched_one(tmp_path_factory, build_tiny_root):
    """Every example runs as it is (the mismatched one is refused), so the canvas must agree before the run:
    no warning on any node of any example but the steps conflict of wan22_mismatched_contract. A false warning
    here is a rule the page checks differently from the sampler."""
    result = _page_result(build_tiny_root, tmp_path_factory.mktemp("examples"), "drive_examples.js")
    examples = result["examples"]
    assert len(examples) == len([p for p in (PACK_DIR / "workflows" / "api").glob("*.api.json")
                                 if not p.name.startswith("comfy_")])  # ComfyUI-native examples have no UI twin
    warnings = {name: {node: [line for line in lines if line.startswith("lorabind-warning")]
                       for node, lines in badges.items()} for name, badges in examples.items()}
    flagged = {name: {node: lines for node, lines in nodes.items() if lines} for name, nodes in warnings.items()}
    assert {name: nodes for name, nodes in flagged.items() if nodes} == {"wan22_mismatched_contract": {
        "6 LoraBindSampler": [f"lorabind-warning: ⚠ steps 20 ≠ 4 required by {HIGH}",
                              f"lorabind-warning: ⚠ steps 20 ≠ 4 required by {LOW}"]}}
    # what the canvas knows before a run, for one example per kind of file
    turbo = examples["minimax_h3_turbo_8step"]
    assert any("(turbo): 8 steps · shift 12" in line and "from its file name" in line
               for lines in turbo.values() for line in lines), turbo
    native = examples["minimax_h3_native"]
    assert any("(native): 4 steps" in line and "from its metadata" in line
               for lines in native.values() for line in lines), native
    pinned = examples["minimax_h3_pinned"]
    assert any("(pinned)" in line and "from its checkpoint" in line
               for lines in pinned.values() for line in lines), pinned
    peft = examples["peft_two_branches"]
    assert any("tiny-wan21-style-peft: no sampling contract" in line for lines in peft.values() for line in lines)
