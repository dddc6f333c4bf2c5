"""Mute and bypass convert exactly as the frontend we serve exports them (issue 30).

``frontend_exports_1.58.1.json`` holds ``graphToPrompt().output`` of comfyui-frontend-package 1.58.1 for each case
of ``ui_workflow_builders.frontend_export_cases``, captured in Chromium (the browser test
``test_server_frontend_exports.py`` checks the live frontend still exports the same). Where an older frontend
converted differently, ``lorabind run`` says so per node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorabind.runtime.workflow_format import to_api_prompt
from lorabind.runtime.workflow_mode_notes import older_frontend_differences
from runtime_fake_nodes import FAKE_NODES
from ui_workflow_builders import frontend_export_cases

EXPORTS = json.loads(Path(__file__).with_name("frontend_exports_1.58.1.json").read_text(encoding="utf-8"))["exports"]
CASES = frontend_export_cases()


def test_every_case_has_a_captured_export():
    assert sorted(EXPORTS) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_conversion_equals_the_pinned_frontends_export(case):
    prompt, kind = to_api_prompt(CASES[case], FAKE_NODES)
    assert kind == "ui"
    assert prompt == EXPORTS[case]


def test_what_the_frontend_export_means_for_each_mode():
    """The captured facts in words, so a re-capture that changes them is read, not just accepted."""
    muted, bypassed = EXPORTS["muted_subgraph_instance"], EXPORTS["bypassed_subgraph_instance"]
    assert not any(node_id.startswith("2:") for node_id in [*muted, *bypassed])  # no inner node of instance 2
    assert muted["4"]["inputs"] == {} and bypassed["4"]["inputs"] == {"value": ["1", 0]}
    assert "base" not in EXPORTS["muted_reroute"]["4"]["inputs"]
    assert EXPORTS["bypassed_reroute"]["4"]["inputs"]["base"] == ["1", 0]
    for case in ("muted_primitivenode", "bypassed_primitivenode"):
        assert EXPORTS[case]["4"]["inputs"]["seed"] == 77


def test_run_warns_where_an_older_frontend_converted_differently():
    assert older_frontend_differences(CASES["muted_subgraph_instance"]) == [
        "node 2 is a muted subgraph instance: none of its inner nodes run (as ComfyUI's frontend 1.58.1 exports "
        "it; older frontends ran them)"]
    assert older_frontend_differences(CASES["bypassed_subgraph_instance"])[0].startswith(
        "node 2 is a bypassed subgraph instance: none of its inner nodes run")
    assert older_frontend_differences(CASES["muted_reroute"]) == [
        "node 2 is a muted Reroute: the link through it is dropped (as ComfyUI's frontend 1.58.1 exports it; older "
        "frontends passed it through)"]
    for case in ("bypassed_reroute", "muted_primitivenode", "bypassed_primitivenode"):
        assert older_frontend_differences(CASES[case]) == []
    assert older_frontend_differences({"1": {"class_type": "RtInt", "inputs": {}}}) == []
