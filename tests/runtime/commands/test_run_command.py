"""``lorabind run`` end to end on fake nodes: formats, --set, outputs, validation and node failures."""

from __future__ import annotations

import json
import os

import pytest

from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main
from lorabind.runtime.commands import run as run_command
from lorabind.runtime.commands import run_messages
from runtime_fake_nodes import FAKE_NODES


@pytest.fixture
def fake_pack(monkeypatch, tmp_path):
    built = []
    monkeypatch.setattr(run_command, "load_node_classes", lambda: (FAKE_NODES, {"RtInt": "Integer"}))
    monkeypatch.setattr(run_command, "ensure_models", lambda prompt, root, input_dir: built.append((prompt, root)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    yield built
    folder_paths.configure()


def api_workflow(tmp_path, value=5, middle="RtSeeded"):
    middle_inputs = {"base": ["1", 0], "seed": 3, "mode": "add", "style": "plain", "scale": 1.0}
    if middle == "RtFail":
        middle_inputs = {"value": ["1", 0]}
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": value}},
              "2": {"class_type": middle, "inputs": middle_inputs},
              "3": {"class_type": "RtSaveText", "inputs": {"value": ["2", 0], "filename_prefix": "runs/rt"}}}
    path = tmp_path / "workflow.json"
    path.write_text(json.dumps(prompt))
    return str(path)


def run(tmp_path, workflow, *extra):
    return main(["run", workflow, "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"),
                 *extra])


def test_run_api_workflow_with_set_writes_outputs(fake_pack, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the root conftest sets it: the command must set it itself
    code = run(tmp_path, api_workflow(tmp_path), "--set", "2.seed=10", "--set", "3.filename_prefix=runs/final")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "API prompt of 3 nodes" in captured.out
    written = tmp_path / "out" / "runs" / "final_00001_.txt"
    assert f"node 3 (RtSaveText) wrote images: {written}" in captured.out
    assert written.read_text() == str(5 + 10)
    (prompt, models_root), = fake_pack
    assert prompt["2"]["inputs"]["seed"] == 10 and models_root == str(tmp_path / "models")
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_run_ui_workflow_reports_the_format(fake_pack, tmp_path, capsys):
    workflow = {"nodes": [
        {"id": 1, "type": "RtInt", "mode": 0, "inputs": [], "outputs": [{"name": "INT", "type": "INT", "links": [1]}],
         "widgets_values": [7]},
        {"id": 2, "type": "RtShow", "mode": 0, "inputs": [{"name": "value", "type": "INT,FLOAT", "link": 1}],
         "outputs": []}], "links": [[1, 1, 0, 2, 0, "INT"]]}
    path = tmp_path / "ui.json"
    path.write_text(json.dumps(workflow))
    assert run(tmp_path, str(path), "--set", "1.value=8") == 0
    out = capsys.readouterr().out
    assert "UI workflow, converted to an API prompt of 2 nodes" in out
    assert "node 2 (RtShow) text: 8" in out


@pytest.mark.parametrize("override, message", [
    ("9.value=1", "the workflow has no node with id '9'"),
    ("1.amount=1", "node 1 (RtInt) has no input 'amount'"),
    ("1value", "expected NODE.INPUT=VALUE"),
])
def test_bad_set_is_an_error_naming_it(fake_pack, tmp_path, capsys, override, message):
    assert run(tmp_path, api_workflow(tmp_path), "--set", override) == 1
    assert message in capsys.readouterr().err


def test_set_value_falls_back_to_a_string(fake_pack, tmp_path, capsys):
    assert run(tmp_path, api_workflow(tmp_path), "--set", "2.mode=not json") == 1
    err = capsys.readouterr().err
    assert "node 2 (RtSeeded):" in err
    assert "input 'mode': Value not in list: 'not json' not in ['add', 'mul']" in err


@pytest.mark.parametrize("override, line", [
    ("1.value=-5", "node 1 (RtInt):\n    - input 'value': Value -5 smaller than min of 0\n"),
    ("1.value=abc", "node 1 (RtInt):\n    - input 'value': Failed to convert an input value to a INT value: abc, "),
    ('3.value=["9", 0]', "node 3 (RtSaveText):\n    - input 'value': Bad linked input, must be a length-2 list of "
                         "[node_id, slot_index]: linked node '9' does not exist in the prompt\n"),
])
def test_validation_failure_names_node_class_and_input(fake_pack, tmp_path, capsys, override, line):
    assert run(tmp_path, api_workflow(tmp_path), "--set", override) == 1
    err = capsys.readouterr().err
    assert err.startswith("lorabind run: Prompt outputs failed validation\n") and line in err


def test_failing_node_exits_non_zero_naming_node_and_class(fake_pack, tmp_path, capsys):
    assert run(tmp_path, api_workflow(tmp_path, middle="RtFail")) == 1
    err = capsys.readouterr().err
    assert "node 2 (RtFail) failed: ValueError: cannot handle value 5" in err
    # with a title (what the ComfyUI canvas shows) the message carries it too
    path = api_workflow(tmp_path, middle="RtFail")
    prompt = json.loads((tmp_path / "workflow.json").read_text())
    prompt["2"]["_meta"] = {"title": "Picky node"}
    (tmp_path / "workflow.json").write_text(json.dumps(prompt))
    assert run(tmp_path, path) == 1
    assert 'node 2 "Picky node" (RtFail) failed: ValueError: cannot handle value 5' in capsys.readouterr().err


def test_unreadable_workflow_file(fake_pack, tmp_path, capsys):
    assert run(tmp_path, str(tmp_path / "nope.json")) == 1
    assert f"workflow file '{tmp_path / 'nope.json'}' does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert run(tmp_path, str(bad)) == 1
    assert "is not valid JSON" in capsys.readouterr().err


def test_a_saved_video_reads_as_a_video_though_comfyui_reports_it_under_images():
    outputs = {"8": {"images": [{"filename": "clip_00001_.mp4", "subfolder": "lorabind", "type": "output"},
                                {"filename": "frame_00001_.webp", "subfolder": "", "type": "output"}],
                     "animated": [True]}}
    lines = run_messages.describe_outputs(outputs, {"8": {"class_type": "LoraBindSaveVideo"}}, lambda kind: "/out")
    assert lines == [f"node 8 (LoraBindSaveVideo) wrote video: {os.path.join('/out', 'lorabind', 'clip_00001_.mp4')}",
                     f"node 8 (LoraBindSaveVideo) wrote images: {os.path.join('/out', '', 'frame_00001_.webp')}"]
