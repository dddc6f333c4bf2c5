"""UI (litegraph) -> API conversion: widgets, control values, Reroute, PrimitiveNode, bypass, mute, subgraph."""

from __future__ import annotations

import pytest

from lorabind.runtime.executor import PromptExecutor
from lorabind.runtime.workflow_format import WorkflowFormatError, detect_format, to_api_prompt
from runtime_fake_nodes import FAKE_NODES
from ui_workflow_builders import _seeded_subgraph, _two_instances, out, sock, ui_node

SUBGRAPH_ID = "5f0c2f6e-0000-4000-8000-000000000001"


def hand_made_workflow():
    nodes = [
        ui_node(1, "RtInt", outputs=[out("INT", [1, 7])], widgets=[2]),
        ui_node(10, "Reroute", inputs=[sock("", "*", 1)], outputs=[out("INT", [2])]),
        ui_node(11, "PrimitiveNode", outputs=[out("INT", [3], widget="seed")], widgets=[4, "fixed"]),
        ui_node(3, "RtSeeded", title="My seeded",
                inputs=[sock("base", "INT", 2), sock("seed", "INT", 3, widget=True)],
                outputs=[out("INT", [4])],
                # seed, its control value, mode, its control value + filter, style, scale, offset
                widgets=[123, "randomize", "mul", "increment", "", "plain", 2.0, 1]),
        ui_node(5, "RtDouble", mode=4, inputs=[sock("value", "INT", 4)], outputs=[out("INT", [5])]),
        ui_node(6, "RtShow", inputs=[sock("value", "INT,FLOAT", 5)]),
        ui_node(7, "RtInt", mode=2, outputs=[out("INT", [6])], widgets=[50]),
        ui_node(8, "RtShow", inputs=[sock("value", "INT,FLOAT", 6)]),
        ui_node(9, "Note", widgets=["remember to bump the seed"]),
        ui_node(20, SUBGRAPH_ID, inputs=[sock("x", "INT", 7)], outputs=[out("INT", [8])]),
        ui_node(21, "RtShow", inputs=[sock("value", "INT,FLOAT", 8)]),
    ]
    links = [[1, 1, 0, 10, 0, "INT"], [2, 10, 0, 3, 0, "INT"], [3, 11, 0, 3, 1, "INT"], [4, 3, 0, 5, 0, "INT"],
             [5, 5, 0, 6, 0, "INT"], [6, 7, 0, 8, 0, "INT"], [7, 1, 0, 20, 0, "INT"], [8, 20, 0, 21, 0, "INT"]]
    subgraph = {
        "id": SUBGRAPH_ID, "name": "adder", "version": 1,
        "inputNode": {"id": -10, "bounding": [0, 0, 10, 10]}, "outputNode": {"id": -20, "bounding": [0, 0, 10, 10]},
        "inputs": [{"id": "in-x", "name": "x", "type": "INT", "linkIds": [101]}],
        "outputs": [{"id": "out-y", "name": "y", "type": "INT", "linkIds": [102]}],
        "widgets": [],
        "nodes": [ui_node(1, "RtAdd", inputs=[sock("a", "INT", 101), sock("b", "INT", None, widget=True)],
                          outputs=[out("INT", [102])], widgets=[10])],
        "links": [{"id": 101, "origin_id": -10, "origin_slot": 0, "target_id": 1, "target_slot": 0, "type": "INT"},
                  {"id": 102, "origin_id": 1, "origin_slot": 0, "target_id": -20, "target_slot": 0,
                   "type": "INT"}],
    }
    return {"id": "wf", "revision": 0, "last_node_id": 21, "last_link_id": 8, "nodes": nodes, "links": links,
            "groups": [], "config": {}, "extra": {}, "version": 0.4, "definitions": {"subgraphs": [subgraph]}}


def test_ui_workflow_converts_like_the_frontend():
    prompt, kind = to_api_prompt(hand_made_workflow(), FAKE_NODES)
    assert kind == "ui"
    assert sorted(prompt) == ["1", "20:1", "21", "3", "6", "8"]  # no Reroute, Primitive, Note, muted, bypassed
    assert prompt["1"] == {"inputs": {"value": 2}, "class_type": "RtInt", "_meta": {"title": "RtInt"}}
    # the PrimitiveNode's value replaces the stale widget value; control values are not inputs
    assert prompt["3"] == {"inputs": {"base": ["1", 0], "seed": 4, "mode": "mul", "style": "plain", "scale": 2.0,
                                      "offset": 1},
                           "class_type": "RtSeeded", "_meta": {"title": "My seeded"}}
    assert prompt["6"]["inputs"] == {"value": ["3", 0]}  # through the bypassed RtDouble
    assert prompt["8"]["inputs"] == {}  # its only input came from a muted node
    assert prompt["20:1"]["inputs"] == {"a": ["1", 0], "b": 10}
    assert prompt["21"]["inputs"] == {"value": ["20:1", 0]}


def test_converted_workflow_runs():
    prompt, _ = to_api_prompt(hand_made_workflow(), FAKE_NODES)
    executor = PromptExecutor(FAKE_NODES)
    validation = executor.validate(prompt)
    assert sorted(validation.outputs) == ["21", "6"]
    assert validation.node_errors["8"]["errors"][0]["type"] == "required_input_missing"
    result = executor.execute(prompt, "ui", execute_outputs=validation.outputs)
    base, seed, scale, offset = 2, 4, 2.0, 1
    assert result.outputs["6"] == {"text": [str(int(base * seed * scale) + offset)]}
    assert result.outputs["21"] == {"text": [str(base + 10)]}


def test_widgets_values_as_a_dict_and_array_values_are_wrapped():
    class Curve:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"points": ("STRING",), "mode": (["linear", "cubic"],)}}

        RETURN_TYPES = ()
        FUNCTION = "run"
        OUTPUT_NODE = True

    workflow = {"nodes": [ui_node(4, "Curve", widgets={"mode": "cubic", "points": [0.0, 1.0]})], "links": []}
    prompt, _ = to_api_prompt(workflow, {"Curve": Curve})
    assert prompt["4"]["inputs"] == {"points": {"__value__": [0.0, 1.0]}, "mode": "cubic"}


def test_format_detection():
    api = {"3": {"class_type": "RtInt", "inputs": {"value": 1}}}
    assert detect_format(api) == "api"
    assert to_api_prompt({"prompt": api}, FAKE_NODES) == (api, "api")
    assert to_api_prompt(api, FAKE_NODES)[1] == "api"
    assert detect_format(hand_made_workflow()) == "ui"
    with pytest.raises(WorkflowFormatError, match="Not a ComfyUI workflow"):
        detect_format({"hello": "world"})


def test_unknown_node_type_names_the_node():
    workflow = {"nodes": [ui_node(12, "SomeoneElsesNode", widgets=[1])], "links": []}
    with pytest.raises(WorkflowFormatError, match="Node 12 has type 'SomeoneElsesNode'"):
        to_api_prompt(workflow, FAKE_NODES)


def test_node_without_type_is_named_not_a_key_error():
    workflow = {"nodes": [ui_node(12, "SomeoneElsesNode", widgets=[1])], "links": []}
    del workflow["nodes"][0]["type"]
    with pytest.raises(WorkflowFormatError, match=r"node 12 has no 'type'"):
        to_api_prompt(workflow, FAKE_NODES)


def test_malformed_link_is_a_workflow_format_error():
    workflow = hand_made_workflow()
    workflow["links"].append({"id": 999})  # a link object without origin/target
    with pytest.raises(WorkflowFormatError, match="malformed UI workflow: KeyError"):
        to_api_prompt(workflow, FAKE_NODES)


# --- issue #13: where we diverged from the frontend's graphToPrompt --------------------------------------------

def test_each_subgraph_instance_keeps_its_own_promoted_widget_value():
    prompt, _ = to_api_prompt(_two_instances(), FAKE_NODES)
    assert (prompt["2:1"]["inputs"]["seed"], prompt["3:1"]["inputs"]["seed"]) == (11, 22)
    assert prompt["2:1"]["inputs"]["base"] == ["1", 0]
    # older saves kept a slot for the seed's control_after_generate companion
    legacy, _ = to_api_prompt(_two_instances(widgets=((11, "fixed"), (22, "randomize"))), FAKE_NODES)
    assert (legacy["2:1"]["inputs"]["seed"], legacy["3:1"]["inputs"]["seed"]) == (11, 22)


def test_missing_widget_values_get_the_node_defaults():
    nodes = [ui_node(1, "RtInt", outputs=[out("INT", [1])], widgets=[3]),
             # an older save: seed and its control value only; mode, style, scale and offset came later
             ui_node(2, "RtSeeded", inputs=[sock("base", "INT", 1)], outputs=[out("INT", [])],
                     widgets=[5, "fixed"]),
             ui_node(3, "RtText")]  # no widgets_values at all
    prompt, _ = to_api_prompt({"nodes": nodes, "links": [[1, 1, 0, 2, 0, "INT"]]}, FAKE_NODES)
    assert prompt["2"]["inputs"] == {"base": ["1", 0], "seed": 5, "mode": "add", "style": "plain", "scale": 1.0,
                                     "offset": 0}
    assert prompt["3"]["inputs"] == {"text": "", "enabled": True}


def test_subgraph_expansion_is_capped_and_self_containment_refused():
    fanout = []
    for level in range(8):  # each definition holds 4 instances of the next: 4**8 = 65,536 leaves
        definition = _seeded_subgraph() if level == 0 else {
            "id": f"level-{level}", "name": f"level {level}", "inputs": [], "outputs": [], "links": [],
            "nodes": [ui_node(i, fanout[-1]["id"]) for i in range(1, 5)]}
        definition["id"] = definition["id"] if level else "level-0"
        fanout.append(definition)
    workflow = {"nodes": [ui_node(1, "level-7")], "links": [], "definitions": {"subgraphs": fanout}}
    with pytest.raises(WorkflowFormatError, match="expand to more than 10000 nodes"):
        to_api_prompt(workflow, FAKE_NODES)
    loop = {"id": "loop", "name": "ouroboros", "inputs": [], "outputs": [], "links": [],
            "nodes": [ui_node(1, "loop")]}
    with pytest.raises(WorkflowFormatError, match="subgraph 'ouroboros' contains itself"):
        to_api_prompt({"nodes": [ui_node(1, "loop")], "links": [], "definitions": {"subgraphs": [loop]}}, FAKE_NODES)


def test_a_reroute_loop_or_a_very_long_chain_is_a_format_error():
    nodes = [ui_node(1, "Reroute", inputs=[sock("", "*", 2)], outputs=[out("*", [1])]),
             ui_node(2, "Reroute", inputs=[sock("", "*", 1)], outputs=[out("*", [2, 3])]),
             ui_node(3, "RtShow", inputs=[sock("value", "INT,FLOAT", 3)])]
    links = [[1, 1, 0, 2, 0, "*"], [2, 2, 0, 1, 0, "*"], [3, 2, 0, 3, 0, "*"]]
    with pytest.raises(WorkflowFormatError, match="links loop"):
        to_api_prompt({"nodes": nodes, "links": links}, FAKE_NODES)
