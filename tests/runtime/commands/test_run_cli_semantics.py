"""``lorabind run`` as a person types it: booleans in words, honest node names after ``--set``, an unknown core
class that says what this runtime offers, and counts in the right number (issue 19)."""

from __future__ import annotations

import json

import pytest

from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main
from lorabind.runtime.commands import run as run_command
from lorabind.runtime.executor.definitions import parse_bool
from runtime_fake_nodes import FAKE_NODES


@pytest.fixture
def fake_pack(monkeypatch):
    monkeypatch.setattr(run_command, "load_node_classes", lambda: (FAKE_NODES, {}))
    monkeypatch.setattr(run_command, "ensure_models", lambda prompt, root, input_dir: None)
    yield
    folder_paths.configure()


def write(tmp_path, prompt) -> str:
    path = tmp_path / "workflow.json"
    path.write_text(json.dumps(prompt))
    return str(path)


def run(tmp_path, workflow, *extra):
    return main(["run", workflow, "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"), *extra])


def text_workflow(tmp_path, enabled=True) -> str:
    return write(tmp_path, {"1": {"class_type": "RtText", "inputs": {"text": "hello", "enabled": enabled}},
                            "2": {"class_type": "RtShowString", "inputs": {"text": ["1", 0]}}})


@pytest.mark.parametrize("spelling, expected", [
    ("off", False), ("False", False), ("no", False), ("NO", False), ("0", False), ('"false"', False),
    ("on", True), ("TRUE", True), ("Yes", True), ("1", True), ("true", True),
])
def test_set_parses_a_boolean_the_way_a_person_writes_it(fake_pack, tmp_path, capsys, spelling, expected):
    assert run(tmp_path, text_workflow(tmp_path, enabled=not expected), "--set", f"1.enabled={spelling}") == 0
    out = capsys.readouterr().out
    # RtText passes its text through only when enabled; RtShowString shows what arrived
    assert f"node 2 (RtShowString) text: {'hello' if expected else ''}\n" in out


@pytest.mark.parametrize("spelling", ["maybe", "2", "[]", "nope"])
def test_set_refuses_a_boolean_it_cannot_read_with_the_accepted_spellings(fake_pack, tmp_path, capsys, spelling):
    assert run(tmp_path, text_workflow(tmp_path), "--set", f"1.enabled={spelling}") == 1
    err = capsys.readouterr().err
    assert f"--set '1.enabled={spelling}': input 'enabled' of node 1 is a BOOLEAN" in err
    assert "true/on/yes/1 or false/off/no/0 (any case)" in err


def test_a_boolean_string_in_an_api_prompt_is_read_not_taken_as_true():
    from lorabind.runtime.executor import PromptExecutor

    prompt = {"1": {"class_type": "RtText", "inputs": {"text": "hello", "enabled": "off"}},
              "2": {"class_type": "RtShowString", "inputs": {"text": ["1", 0]}}}
    validation = PromptExecutor(FAKE_NODES).validate(prompt)
    assert validation.ok and validation.prompt["1"]["inputs"]["enabled"] is False
    assert [parse_bool(v) for v in (True, 0, 1.0, " Off ")] == [True, False, True, False]


def test_one_node_is_singular(fake_pack, tmp_path, capsys):
    path = write(tmp_path, {"1": {"class_type": "RtShow", "inputs": {"value": 3}}})
    assert run(tmp_path, path) == 0
    assert "API prompt of 1 node\n" in capsys.readouterr().out


def test_a_failed_node_changed_by_set_is_not_named_by_its_stale_title(fake_pack, tmp_path, capsys):
    prompt = {"2": {"class_type": "RtFail", "inputs": {"value": 4}, "_meta": {"title": "Fail (value 4)"}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    path = write(tmp_path, prompt)
    assert run(tmp_path, path) == 1
    assert 'node 2 "Fail (value 4)" (RtFail) failed: ValueError' in capsys.readouterr().err
    assert run(tmp_path, path, "--set", "2.value=6") == 1
    err = capsys.readouterr().err
    assert "Fail (value 4)" not in err
    assert "node 2 (with --set value=6) (RtFail) failed: ValueError: cannot handle value 6" in err


def test_an_unknown_core_class_says_which_nodes_this_runtime_offers(fake_pack, tmp_path, capsys):
    path = write(tmp_path, {"1": {"class_type": "KSampler", "inputs": {}}})
    assert run(tmp_path, path) == 1
    err = capsys.readouterr().err
    assert "Cannot execute because node KSampler does not exist.: Node ID '#1'" in err
    assert "This runtime offers only these nodes: " + ", ".join(sorted(FAKE_NODES)) in err
    assert "ComfyUI's core nodes (KSampler, CheckpointLoaderSimple, ...) are not available headless" in err
