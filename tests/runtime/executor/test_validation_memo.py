"""The validation memo (issue 33): a prompt that changed only constants re-checks only those nodes and the nodes with
VALIDATE_INPUTS, and every prompt gets exactly the result the full validation gives, errors included."""

from __future__ import annotations

import copy

import pytest

from lorabind.runtime.executor import validation
from lorabind.runtime.executor.definitions import NodeDefinitions
from lorabind.runtime.executor.validation_memo import ValidationMemo
from runtime_fake_nodes import FAKE_NODES

CHOICES = ["a.safetensors", "b.safetensors"]  # a loader's folder listing, as the tests change it
ALLOWED = {"ok": True}  # what a VALIDATE_INPUTS that looks outside the prompt (a file) finds there


class Listing:
    """A COMBO whose choices follow a folder, and a VALIDATE_INPUTS that looks at something outside the prompt."""

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": (list(CHOICES),), "seed": ("INT", {"min": 0, "max": 1000})}}

    @classmethod
    def VALIDATE_INPUTS(cls, seed):  # takes ``seed`` only: ``name`` keeps the executor's choice check
        return True if ALLOWED["ok"] else f"seed {seed}: the file cannot be read"

    def run(self, name, seed):
        return (seed,)


NODES = {**FAKE_NODES, "Listing": Listing}


def base_prompt():
    return {"1": {"class_type": "RtInt", "inputs": {"value": 3}},
            "2": {"class_type": "RtAdd", "inputs": {"a": ["1", 0], "b": 1}},
            "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}},
            "4": {"class_type": "RtFloat", "inputs": {"value": 0.5}},
            "5": {"class_type": "RtShow", "inputs": {"value": ["4", 0]}},
            "6": {"class_type": "Listing", "inputs": {"name": "a.safetensors", "seed": 7}},
            "7": {"class_type": "RtShow", "inputs": {"value": ["6", 0]}}}


def same(memoised, full) -> bool:
    """Equal results, down to the type of every cast value (``1 == 1.0 == True`` in Python; ``repr`` tells)."""
    return memoised == full and repr(memoised.prompt) == repr(full.prompt)


def edited(prompt, node_id, name, value):
    changed = copy.deepcopy(prompt)
    changed[node_id]["inputs"][name] = value
    return changed


@pytest.fixture(autouse=True)
def _outside_world():
    CHOICES[:] = ["a.safetensors", "b.safetensors"]
    ALLOWED["ok"] = True
    yield
    CHOICES[:] = ["a.safetensors", "b.safetensors"]
    ALLOWED["ok"] = True


@pytest.fixture
def checked(monkeypatch):
    """What the validator checked, per call: ("node", id) validated whole, ("constants", id, names) re-checked."""
    seen = []
    validator = validation.InputValidator
    validate_node, check_constants = validator._validate_node, validator.check_constants

    def whole(self, node_id):
        seen.append(("node", node_id))
        return validate_node(self, node_id)

    def constants(self, node_id, names):
        seen.append(("constants", node_id, list(names)))
        return check_constants(self, node_id, names)

    monkeypatch.setattr(validation.InputValidator, "_validate_node", whole)
    monkeypatch.setattr(validation.InputValidator, "check_constants", constants)
    return seen


def test_a_seed_change_rechecks_only_that_constant_and_the_nodes_with_validate_inputs(checked):
    memo = ValidationMemo()
    first = memo.validate(NODES, base_prompt())
    assert first.ok and len(checked) == 7
    checked.clear()
    again = memo.validate(NODES, edited(base_prompt(), "1", "value", 4))
    assert checked == [("constants", "1", ["value"]), ("node", "6")]
    assert again == validation.validate_prompt(NODES, edited(base_prompt(), "1", "value", 4))
    assert again.prompt["1"]["inputs"]["value"] == 4


def _prompts():
    """A session of prompts: each one is compared with the full validation of the same prompt."""
    base = base_prompt()
    relinked = copy.deepcopy(base)
    relinked["3"]["inputs"]["value"] = ["4", 0]
    grown = copy.deepcopy(base)
    grown["8"] = {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}
    return [
        ("seed", edited(base, "6", "seed", 8)),
        ("out of range", edited(base, "1", "value", 101)),
        ("back in range", edited(base, "1", "value", 100)),
        ("int for a float", edited(base, "4", "value", 1)),
        ("bool for an int", edited(base, "2", "b", True)),
        ("string for an int", edited(base, "2", "b", "2")),
        ("not a number", edited(base, "2", "b", "two")),
        ("relinked", relinked),
        ("bad link", edited(base, "3", "value", ["9", 0])),
        ("node added", grown),
        ("class changed", {**base, "3": {"class_type": "RtShowString", "inputs": {"text": ["2", 0]}}}),
        ("input missing", {**base, "2": {"class_type": "RtAdd", "inputs": {"a": ["1", 0]}}}),
        ("unchanged", base),
    ]


@pytest.mark.parametrize("name,prompt", _prompts(), ids=[name for name, _ in _prompts()])
def test_every_prompt_gets_the_full_validations_result(name, prompt):
    memo = ValidationMemo()
    assert memo.validate(NODES, base_prompt()).ok
    assert same(memo.validate(NODES, prompt), validation.validate_prompt(NODES, prompt))
    assert same(memo.validate(NODES, base_prompt()), validation.validate_prompt(NODES, base_prompt()))


def test_a_choice_gone_from_the_folder_and_a_file_validate_inputs_refuses_are_refused_on_the_next_prompt():
    memo = ValidationMemo()
    assert memo.validate(NODES, base_prompt()).ok
    CHOICES.remove("a.safetensors")
    gone = memo.validate(NODES, edited(base_prompt(), "1", "value", 5))
    assert gone.node_errors["6"]["errors"][0]["type"] == "value_not_in_list" and "7" not in gone.outputs
    assert gone == validation.validate_prompt(NODES, edited(base_prompt(), "1", "value", 5))
    CHOICES.append("a.safetensors")
    assert memo.validate(NODES, base_prompt()).ok
    ALLOWED["ok"] = False
    refused = memo.validate(NODES, edited(base_prompt(), "1", "value", 6))
    assert refused.node_errors["6"]["errors"][0]["type"] == "custom_validation_failed" and "7" not in refused.outputs
    assert refused == validation.validate_prompt(NODES, edited(base_prompt(), "1", "value", 6))


def test_editing_the_sent_prompt_in_place_cannot_edit_what_the_memo_compares_with():
    memo = ValidationMemo()
    prompt = base_prompt()
    assert memo.validate(NODES, prompt).ok
    prompt["1"]["inputs"]["value"] = 101  # the caller reuses its dict for the next prompt (the bench does)
    refused = memo.validate(NODES, prompt)
    assert refused.node_errors["1"]["errors"][0]["type"] == "value_bigger_than_max" and refused.outputs == ["5", "7"]


class Modes:
    """A COMBO of numbers: no cast, so ``True`` in place of ``1`` would reach the node as sent."""

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"mode": ([0, 1],)}}

    def run(self, mode):
        return (mode,)


def test_an_equal_constant_of_another_type_is_checked_again():
    nodes = {**NODES, "Modes": Modes}
    prompt = {"1": {"class_type": "Modes", "inputs": {"mode": 1}}, "2": {"class_type": "RtShow",
                                                                        "inputs": {"value": ["1", 0]}}}
    memo = ValidationMemo()
    assert memo.validate(nodes, prompt).ok
    flipped = edited(prompt, "1", "mode", True)
    again = memo.validate(nodes, flipped)
    assert again.prompt["1"]["inputs"]["mode"] is True and same(again, validation.validate_prompt(nodes, flipped))


class Picker:
    """A loader-like COMBO without VALIDATE_INPUTS: only its declaration says the file is gone."""

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": (list(CHOICES),)}}

    def run(self, name):
        return (len(name),)


def test_a_node_whose_declaration_changed_is_checked_again_though_its_inputs_did_not():
    nodes = {**NODES, "Picker": Picker}
    prompt = {**base_prompt(), "8": {"class_type": "Picker", "inputs": {"name": "b.safetensors"}},
              "9": {"class_type": "RtShow", "inputs": {"value": ["8", 0]}}}
    memo = ValidationMemo()
    assert memo.validate(nodes, prompt).node_errors == {}
    CHOICES.remove("b.safetensors")
    gone = memo.validate(nodes, edited(prompt, "1", "value", 9))
    assert gone.node_errors["8"]["errors"][0]["type"] == "value_not_in_list" and "9" not in gone.outputs


class SameDict:
    """Returns the one dict it keeps, as some custom nodes do, so it can change its declaration in place."""

    DECLARED = {"required": {"count": ("INT", {"min": 0, "max": 10})}, "hidden": {"me": "UNIQUE_ID"}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return cls.DECLARED

    def run(self, count, me=None):
        return (count,)


def test_a_rerun_takes_what_was_read_from_the_memos_copies_until_a_declaration_changes_in_place(monkeypatch):
    monkeypatch.setattr(SameDict, "DECLARED", copy.deepcopy(SameDict.DECLARED))
    nodes = {**NODES, "SameDict": SameDict}
    prompt = {"1": {"class_type": "SameDict", "inputs": {"count": 7}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    memo = ValidationMemo()
    assert memo.validate(nodes, prompt).ok
    kept = memo._last.definitions
    rerun = NodeDefinitions(nodes)
    assert memo.validate(nodes, edited(prompt, "1", "count", 8), None, rerun).ok
    assert rerun.input_infos("SameDict") is kept.input_infos("SameDict")
    assert rerun.hidden_inputs("SameDict") == {"me": "UNIQUE_ID"} and rerun.declared_inputs("SameDict") == ("count",)
    SameDict.DECLARED["required"]["count"][1]["max"] = 5  # edited in place: the memo's copy still says 10
    edited_in_place = NodeDefinitions(nodes)
    refused = memo.validate(nodes, edited(prompt, "1", "count", 6), None, edited_in_place)
    assert refused.node_errors["1"]["errors"][0]["type"] == "value_bigger_than_max"
    assert edited_in_place.input_infos("SameDict")["count"][2]["max"] == 5
