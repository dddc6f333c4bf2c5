"""Validation errors have ComfyUI's exact JSON shapes and aggregation into node_errors."""

from __future__ import annotations

import json

from lorabind.runtime.executor import PromptExecutor
from runtime_fake_nodes import FAKE_NODES, RtEven, RtInt, RtSeeded, RtShow


def validate(prompt, targets=None):
    result = PromptExecutor(FAKE_NODES).validate(prompt, targets)
    # everything a client sees must survive JSON unchanged
    assert json.loads(json.dumps([result.error, result.node_errors])) == [result.error, result.node_errors]
    return result


def int_config():
    return list(RtInt.INPUT_TYPES()["required"]["value"])


def single_error(result, node_id):
    entry = result.node_errors[node_id]
    assert len(entry["errors"]) == 1, entry
    return entry["errors"][0]


def test_valid_prompt_casts_constants_without_touching_the_callers_prompt():
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": "7"}},
              "2": {"class_type": "RtText", "inputs": {"text": 12, "enabled": 0}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}},
              "4": {"class_type": "RtShowString", "inputs": {"text": ["2", 0]}}}
    result = validate(prompt)
    assert result.ok and result.error is None and result.node_errors == {}
    assert sorted(result.outputs) == ["3", "4"]
    assert result.prompt["1"]["inputs"]["value"] == 7
    assert result.prompt["2"]["inputs"] == {"text": "12", "enabled": False}
    assert prompt["1"]["inputs"]["value"] == "7"


def test_wrapped_list_values_are_unwrapped():
    class ListWidget:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"values": ("FLOATS",)}}

        RETURN_TYPES = ()
        FUNCTION = "run"
        OUTPUT_NODE = True

    result = PromptExecutor({"ListWidget": ListWidget}).validate(
        {"1": {"class_type": "ListWidget", "inputs": {"values": {"__value__": [1.0, 2.5]}}}})
    assert result.ok
    assert result.prompt["1"]["inputs"]["values"] == [1.0, 2.5]


def test_missing_class_type_and_unknown_class_name_the_node():
    missing = validate({"5": {"inputs": {}}})
    assert missing.error == {"type": "invalid_prompt",
                             "message": "Cannot execute because a node is missing the class_type property.",
                             "details": "Node ID '#5'", "extra_info": {}}
    unknown = validate({"9": {"class_type": "NoSuchNode", "inputs": {}}})
    assert unknown.error["type"] == "invalid_prompt"
    assert unknown.error["message"] == "Cannot execute because node NoSuchNode does not exist."
    # ComfyUI's details first, then which nodes this runtime offers instead
    assert unknown.error["details"].startswith("Node ID '#9'. This runtime offers only these nodes: ")
    assert "ComfyUI's core nodes (KSampler, CheckpointLoaderSimple, ...) are not available headless" in (
        unknown.error["details"])
    assert unknown.error["extra_info"]["available_node_types"] == sorted(FAKE_NODES)
    assert not unknown.ok and unknown.node_errors == {} and unknown.outputs == []
    for node in ({"class_type": ["RtInt"], "inputs": {}}, {"class_type": "RtInt", "inputs": None}):
        malformed = validate({"4": node})
        assert malformed.error["type"] == "invalid_prompt" and malformed.error["details"] == "Node ID '#4'"
    # a link written with an integer node id (a common scripting slip) says what is wrong with it
    int_link = validate({"1": {"class_type": "RtInt", "inputs": {"value": 1}},
                         "2": {"class_type": "RtShow", "inputs": {"value": [1, 0]}}})
    assert single_error(int_link, "2")["details"] == (
        "value, linked node id 1 must be a string (prompt node ids are strings)")


def test_prompt_without_outputs_and_partial_targets():
    result = validate({"1": {"class_type": "RtInt", "inputs": {"value": 1}}})
    assert result.error == {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "",
                            "extra_info": {}}
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    assert validate(prompt, ["3"]).outputs == ["3"]
    assert validate(prompt, ["1"]).error["type"] == "prompt_no_outputs"


def test_required_input_missing_and_aggregation():
    prompt = {"1": {"class_type": "RtInt", "inputs": {}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    result = validate(prompt)
    assert not result.ok
    assert result.error["type"] == "prompt_outputs_failed_validation"
    assert result.error["message"] == "Prompt outputs failed validation"
    # only the node with its own error is listed; both outputs depend on it
    assert list(result.node_errors) == ["1"]
    assert result.node_errors["1"] == {
        "errors": [{"type": "required_input_missing", "message": "Required input is missing", "details": "value",
                    "extra_info": {"input_name": "value"}}],
        "dependent_outputs": ["2", "3"], "class_type": "RtInt"}


def test_one_bad_output_does_not_reject_the_good_one():
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 500}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtInt", "inputs": {"value": 5}},
              "4": {"class_type": "RtShow", "inputs": {"value": ["3", 0]}}}
    result = validate(prompt)
    assert result.ok and result.outputs == ["4"]
    assert result.node_errors["1"]["dependent_outputs"] == ["2"]


def test_return_type_mismatch():
    prompt = {"1": {"class_type": "RtText", "inputs": {"text": "x", "enabled": True}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    error = single_error(validate(prompt), "2")
    assert error == {"type": "return_type_mismatch", "message": "Return type mismatch between linked nodes",
                     "details": "value, received_type(STRING) mismatch input_type(INT,FLOAT)",
                     "extra_info": {"input_name": "value", "input_config": ["INT,FLOAT", {}],
                                    "received_type": "STRING", "linked_node": ["1", 0]}}


def test_comma_union_types_match_by_overlap():
    prompt = {"1": {"class_type": "RtFloat", "inputs": {"value": 0.25}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    assert validate(prompt).ok


def test_invalid_input_type():
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": "seven"}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    error = single_error(validate(prompt), "1")
    exception_message = "invalid literal for int() with base 10: 'seven'"
    assert error == {"type": "invalid_input_type", "message": "Failed to convert an input value to a INT value",
                     "details": f"value, seven, {exception_message}",
                     "extra_info": {"input_name": "value", "input_config": int_config(), "received_value": "seven",
                                    "exception_message": exception_message}}


def test_min_and_max():
    low = {"1": {"class_type": "RtFloat", "inputs": {"value": -3}},
           "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    error = single_error(validate(low), "1")
    config = list(FAKE_NODES["RtFloat"].INPUT_TYPES()["required"]["value"])
    assert error == {"type": "value_smaller_than_min", "message": "Value -3.0 smaller than min of -1.0",
                     "details": "value", "extra_info": {"input_name": "value", "input_config": config,
                                                        "received_value": -3.0}}
    high = {"1": {"class_type": "RtInt", "inputs": {"value": 101}},
            "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    error = single_error(validate(high), "1")
    assert error == {"type": "value_bigger_than_max", "message": "Value 101 bigger than max of 100",
                     "details": "value", "extra_info": {"input_name": "value", "input_config": int_config(),
                                                        "received_value": 101}}


def seeded_prompt(**overrides):
    inputs = {"base": ["1", 0], "seed": 3, "mode": "add", "style": "plain", "scale": 1.0, **overrides}
    return {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
            "2": {"class_type": "RtSeeded", "inputs": inputs},
            "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}


def test_value_not_in_list_for_list_and_combo_forms():
    declared = RtSeeded.INPUT_TYPES()["required"]
    error = single_error(validate(seeded_prompt(mode="pow")), "2")
    assert error == {"type": "value_not_in_list", "message": "Value not in list",
                     "details": "mode: 'pow' not in ['add', 'mul']",
                     "extra_info": {"input_name": "mode", "input_config": [list(declared["mode"][0]),
                                                                           declared["mode"][1]],
                                    "received_value": "pow"}}
    error = single_error(validate(seeded_prompt(style="gaudy")), "2")
    assert error == {"type": "value_not_in_list", "message": "Value not in list",
                     "details": "style: 'gaudy' not in ['plain', 'fancy']",
                     "extra_info": {"input_name": "style", "input_config": list(declared["style"]),
                                    "received_value": "gaudy"}}


def test_value_not_in_long_list_does_not_echo_the_options():
    options = [f"model_{i}.safetensors" for i in range(25)]

    class Picker:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"name": (options,)}}

        RETURN_TYPES = ()
        FUNCTION = "run"
        OUTPUT_NODE = True

    result = PromptExecutor({"Picker": Picker}).validate({"1": {"class_type": "Picker", "inputs": {"name": "x"}}})
    error = result.node_errors["1"]["errors"][0]
    assert error["details"] == "name: 'x' not found (none of the 25 choices is close)"
    assert error["extra_info"]["input_config"] is None


def test_custom_validation_failed():
    prompt = {"1": {"class_type": "RtEven", "inputs": {"value": 3}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    error = single_error(validate(prompt), "1")
    assert error == {"type": "custom_validation_failed", "message": "Custom validation failed for node",
                     "details": "value - 3 is odd", "extra_info": {"input_name": "value"}}
    prompt["1"]["inputs"]["value"] = 4
    assert validate(prompt).ok


def test_validate_inputs_owns_the_bounds_of_the_inputs_it_names():
    # VALIDATE_INPUTS takes `value`, so ComfyUI skips the min/max check of `value`
    prompt = {"1": {"class_type": "RtEven", "inputs": {"value": 12}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    assert validate(prompt).ok
    assert RtEven.INPUT_TYPES()["required"]["value"][1]["max"] < 12


def test_bad_links_name_the_node_and_slot():
    prompt = {"2": {"class_type": "RtShow", "inputs": {"value": ["77", 0]}}}
    error = single_error(validate(prompt), "2")
    assert error["type"] == "bad_linked_input"
    assert error["details"] == "value, linked node '77' does not exist in the prompt"
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 3]}}}
    assert single_error(validate(prompt), "2")["details"] == "value, linked node '1' has no output slot 3"


def test_static_cycle_is_an_error_not_a_recursion_crash():
    prompt = {"1": {"class_type": "RtAdd", "inputs": {"a": ["2", 0], "b": 1}},
              "2": {"class_type": "RtAdd", "inputs": {"a": ["1", 0], "b": 1}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    result = validate(prompt)
    assert not result.ok
    assert sorted(result.node_errors) == ["1", "2"]
    error = result.node_errors["1"]["errors"][0]
    assert error["type"] == "exception_during_validation"
    assert error["extra_info"]["exception_type"] == "graph.DependencyCycleError"
    assert error["details"] == "Dependency cycle detected: 2 -> 1 -> 2"


def test_long_chain_validates_without_recursion():
    prompt = {"0": {"class_type": "RtInt", "inputs": {"value": 1}}}
    for i in range(1, 3000):
        prompt[str(i)] = {"class_type": "RtAdd", "inputs": {"a": [str(i - 1), 0], "b": 1}}
    prompt["out"] = {"class_type": "RtShow", "inputs": {"value": ["2999", 0]}}
    assert validate(prompt).ok


def test_validate_inputs_with_input_types_replaces_the_type_check():
    class AnyNumber:
        OUTPUT_NODE = True

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"value": ("NUMBER",)}}

        RETURN_TYPES = ()
        FUNCTION = "run"

        @classmethod
        def VALIDATE_INPUTS(cls, input_types, value=None):
            assert value is None  # linked inputs arrive as None
            return True if input_types["value"] in ("INT", "FLOAT") else f"got {input_types['value']}"

    nodes = {**FAKE_NODES, "AnyNumber": AnyNumber}
    ok = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
          "2": {"class_type": "AnyNumber", "inputs": {"value": ["1", 0]}}}
    assert PromptExecutor(nodes).validate(ok).ok
    bad = {"1": {"class_type": "RtText", "inputs": {"text": "x", "enabled": True}},
           "2": {"class_type": "AnyNumber", "inputs": {"value": ["1", 0]}}}
    errors = PromptExecutor(nodes).validate(bad).node_errors["2"]["errors"]
    assert [e["details"] for e in errors] == ["value - got STRING", "input_types - got STRING"]


class _Exploding:
    """VALIDATE_INPUTS raises: ComfyUI files that under the raising node, not under the output."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def VALIDATE_INPUTS(cls, value):
        raise RuntimeError(f"cannot check {value}")


def test_exception_in_an_upstream_node_is_filed_under_that_node():
    nodes = {**FAKE_NODES, "Exploding": _Exploding}
    prompt = {"1": {"class_type": "Exploding", "inputs": {"value": 3}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    result = PromptExecutor(nodes).validate(prompt)
    assert not result.ok and sorted(result.node_errors) == ["1"]
    assert result.node_errors["1"]["dependent_outputs"] == ["2"]
    error = single_error(result, "1")
    assert error["type"] == "exception_during_inner_validation"
    assert error["message"] == "Exception when validating inner node" and error["details"] == "cannot check 3"
    extra = error["extra_info"]
    assert (extra["input_name"], extra["linked_node"], extra["exception_type"]) == ("value", ["1", 0], "RuntimeError")
    assert extra["input_config"] == ["INT,FLOAT", {}]  # ComfyUI's (input_type, extra_info)
    assert result.error["details"] == ""  # the output carries no error of its own (ComfyUI's aggregation)

    # the output node itself raising is an exception_during_validation on the output
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    broken = type("BrokenShow", (RtShow,), {"INPUT_TYPES": classmethod(lambda cls: 1 / 0)})
    result = PromptExecutor({**FAKE_NODES, "RtShow": broken}).validate(prompt)
    error = single_error(result, "2")
    assert error["type"] == "exception_during_validation" and error["details"] == "division by zero"
    assert error["extra_info"]["exception_type"] == "ZeroDivisionError"


def _lora_name_refusal(options: list, name: str, tmp_path, monkeypatch) -> str:
    """The details of validating a node whose ``lora_name`` list is ``options`` against ``name`` (the models
    folder pointed at ``tmp_path``)."""
    from lorabind.runtime import folder_paths

    class Picker:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"lora_name": (options,)}}

        RETURN_TYPES = ()
        FUNCTION = "run"
        OUTPUT_NODE = True

    monkeypatch.setattr(folder_paths, "models_dir", str(tmp_path))
    monkeypatch.setattr(folder_paths, "get_folder_paths", lambda kind: [str(tmp_path / kind)])
    result = PromptExecutor({"Picker": Picker}).validate(
        {"1": {"class_type": "Picker", "inputs": {"lora_name": name}}})
    return result.node_errors["1"]["errors"][0]["details"]


def test_a_lora_name_not_in_the_list_names_the_folder_searched_and_the_three_closest(tmp_path, monkeypatch):
    options = ["None"] + [f"lorabind-tiny/wan2.{n}_lora_{i}.safetensors" for n in (1, 2) for i in range(12)]
    wrong = "wan2.2_lora_3.safetensors"  # the fixture's name without its folder
    details = _lora_name_refusal(options, wrong, tmp_path, monkeypatch)
    prefix = f"lora_name: '{wrong}' not found; closest: "
    assert details.startswith(prefix), details
    closest, count = details[len(prefix):].split(" (of ")
    assert closest.split(", ")[0] == "'lorabind-tiny/wan2.2_lora_3.safetensors'" and len(closest.split(", ")) == 3
    assert count == "25 choices); searched models/loras"


def test_a_lora_typo_among_a_short_folder_lists_three_names_then_the_count_not_every_file(tmp_path, monkeypatch):
    """Issue 45 item 7: 19 fixture LoRAs printed whole before "closest"; now three names, then the count."""
    options = ["None"] + [f"lorabind-tiny/fixture_{i:02d}.safetensors" for i in range(18)]
    details = _lora_name_refusal(options, "lorabind-tiny/fixture_7.safetensors", tmp_path, monkeypatch)
    assert details.startswith("lora_name: 'lorabind-tiny/fixture_7.safetensors' not found; closest: "), details
    assert "'lorabind-tiny/fixture_07.safetensors'" in details
    assert details.endswith(" (of 19 choices); searched models/loras")
    assert details.count("fixture_") == 4  # the typo and three names, not all 18


def test_a_mistyped_node_class_gets_a_did_you_mean():
    unknown = validate({"9": {"class_type": "rtshowstrin", "inputs": {}}})
    assert unknown.error["details"].startswith("Node ID '#9'. Did you mean 'RtShowString'? This runtime offers ")
    far = validate({"9": {"class_type": "KSamplerAdvanced", "inputs": {}}})
    assert "Did you mean" not in far.error["details"]
