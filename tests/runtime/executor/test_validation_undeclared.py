"""Issue 46: inputs a node does not declare, and NaN in a bounded number.

ComfyUI 0.3.64 (``execution.py``, read for facts): ``validate_inputs`` checks the declared inputs only;
``get_input_data`` drops an undeclared constant and passes an undeclared link to the node's function, so a
function without ``**kwargs`` failed at run time with a ``TypeError``. Here such a link is refused at validation,
naming the input; undeclared constants are dropped as there, and a variadic function still gets its links."""

from __future__ import annotations

from lorabind.runtime.executor import PromptExecutor
from runtime_fake_nodes import FAKE_NODES


class VariadicShow:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",)}}

    RETURN_TYPES = ()
    FUNCTION = "show"
    OUTPUT_NODE = True

    def show(self, value, **more):
        return {"ui": {"more": sorted(more)}}


NODES = {**FAKE_NODES, "VariadicShow": VariadicShow}


def _validate(prompt):
    return PromptExecutor(NODES).validate(prompt)


def test_a_link_into_an_undeclared_input_is_refused_naming_it():
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0], "image_4": ["1", 0]}}}
    result = _validate(prompt)
    assert not result.ok
    error, = result.node_errors["2"]["errors"]
    assert error["type"] == "undeclared_input" and error["extra_info"]["input_name"] == "image_4"
    assert error["details"] == "image_4: RtShow has no input 'image_4' (its inputs: value)"


def test_an_undeclared_constant_is_dropped_and_a_variadic_node_takes_its_links():
    constant = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
                "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0], "image_4": 5}}}
    assert _validate(constant).ok
    variadic = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
                "2": {"class_type": "VariadicShow", "inputs": {"value": ["1", 0], "extra": ["1", 0]}}}
    assert _validate(variadic).ok


def test_nan_in_a_bounded_number_is_refused():
    prompt = {"1": {"class_type": "RtFloat", "inputs": {"value": float("nan")}},
              "2": {"class_type": "RtShow", "inputs": {"value": ["1", 0]}}}
    error, = _validate(prompt).node_errors["1"]["errors"]
    assert error["type"] == "value_not_a_number" and error["extra_info"]["input_name"] == "value"
    assert error["message"] == "Value nan is not a number between -1.0 and 1.0"
