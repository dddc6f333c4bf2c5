"""NodeDefinitions reads a class's inputs in one pass (issue 33); every answer must be what reading the declaration
name by name gives, and a malformed declaration must still fail only where the malformed input is asked for."""

from __future__ import annotations

import pytest

from lorabind.runtime.executor.call_over_lists import shape_returns
from lorabind.runtime.executor.definitions import NodeDefinitions


def node_class(declared):
    return type("Declared", (), {"INPUT_TYPES": classmethod(lambda cls: declared), "RETURN_TYPES": ()})


def read_by_name(declared, name):
    """The reference: the first of required, optional, hidden that names the input."""
    for category in ("required", "optional", "hidden"):
        section = declared.get(category) or {}
        if name in section:
            spec = section[name]
            if category == "hidden":
                return spec, category, {}
            if isinstance(spec, (list, tuple)):
                return spec[0], category, spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            return spec, category, {}
    return None, None, None


DECLARATIONS = [
    {"required": {"a": ("INT", {"min": 0}), "b": (["x", "y"],), "c": "FLOAT"},
     "optional": {"d": ("STRING", "not a dict"), "a": ("FLOAT", {})}, "hidden": {"p": "PROMPT", "d": "UNIQUE_ID"}},
    {"optional": {"only": ("MODEL", {"lazy": True})}, "required": None},
    {},
]


@pytest.mark.parametrize("declared", DECLARATIONS)
def test_every_input_reads_as_it_does_name_by_name(declared):
    names = sorted({name for section in declared.values() if section for name in section} | {"absent"})
    by_name, whole = NodeDefinitions({"C": node_class(declared)}), NodeDefinitions({"C": node_class(declared)})
    for name in names:
        assert by_name.input_info("C", name) == read_by_name(declared, name)  # asked name by name
        assert whole.input_infos("C")[name] == read_by_name(declared, name)  # the whole table, in one pass
    assert by_name.input_infos("C")["a"] == by_name.input_info("C", "a") == read_by_name(declared, "a")
    assert whole.input_info("C", "a") is whole.input_info("C", "a")  # read once per run


def test_a_malformed_input_fails_only_where_it_is_asked_for():
    declared = {"required": {"a": ("INT", {"max": 3})}, "optional": {"broken": ()}}
    definitions = NodeDefinitions({"C": node_class(declared)})
    assert definitions.input_infos("C")["a"] == ("INT", "required", {"max": 3})
    with pytest.raises(IndexError):
        definitions.input_infos("C")["broken"]
    assert definitions.input_info("C", "a") == ("INT", "required", {"max": 3})
    listed = NodeDefinitions({"C": node_class({"required": {"a": ("INT",)}, "optional": ["b"]})})
    assert listed.input_infos("C")["a"] == ("INT", "required", {})
    with pytest.raises(TypeError):
        listed.input_infos("C")["b"]  # a list section: ``section["b"]`` fails, as it did read by name


def test_flags_read_once_per_run_answer_as_the_class_says():
    output = type("Out", (), {"OUTPUT_NODE": True, "INPUT_TYPES": classmethod(lambda cls: {}), "RETURN_TYPES": ["A"]})
    unique = node_class({"hidden": {"who": "UNIQUE_ID"}})
    definitions = NodeDefinitions({"Out": output, "Unique": unique, "Plain": node_class({})})
    asked = ("Out", "Unique", "Plain", "Out")
    assert [definitions.is_output_node(name) for name in asked] == [True, False, False, True]
    assert [definitions.keys_on_node_id(name) for name in ("Out", "Unique", "Plain")] == [False, True, False]
    assert definitions.return_types("Out") == ("A",) and definitions.hidden_inputs("Unique") == {"who": "UNIQUE_ID"}


def test_one_call_returns_each_slot_as_a_one_item_list_and_lists_still_merge():
    plain = type("Plain", (), {"RETURN_TYPES": ("INT", "STRING")})
    assert shape_returns([(1, "a")], plain, "1", "Plain") == ([[1], ["a"]], {})
    assert shape_returns([(1, "a"), (2, "b")], plain, "1", "Plain") == ([[1, 2], ["a", "b"]], {})
    listed = type("Listed", (), {"RETURN_TYPES": ("INT", "STRING"), "OUTPUT_IS_LIST": (True, False)})
    assert shape_returns([([1, 2], "a")], listed, "1", "Listed") == ([[1, 2], ["a"]], {})
    assert shape_returns([{"result": (3, "c"), "ui": {"text": ["c"]}}], plain, "1", "Plain") == ([[3], ["c"]],
                                                                                               {"text": ["c"]})


def test_lazy_inputs_are_the_declared_inputs_marked_lazy():
    declared = {"required": {"a": ("INT", {"lazy": True}), "b": ("INT", {})}, "optional": {"c": ("IMAGE", {"lazy": 1}),
                "d": "MODEL", "e": ("LATENT", {"lazy": False})}, "hidden": {"p": "PROMPT"}}
    definitions = NodeDefinitions({"C": node_class(declared)})
    assert definitions.lazy_inputs("C") == {"a", "c"}
    assert definitions.lazy_inputs("C") is definitions.lazy_inputs("C")  # read once per class and run
