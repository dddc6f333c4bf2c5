"""Hand-built UI (litegraph) workflows over the fake runtime nodes (``runtime_fake_nodes``): the builders the
conversion tests share, and the cases whose export was captured from the frontend we serve
(``frontend_exports_1.58.1.json``, compared in ``test_workflow_format_frontend.py``)."""

from __future__ import annotations


def ui_node(node_id, node_type, *, inputs=(), outputs=(), widgets=None, mode=0, title=None):
    node = {"id": node_id, "type": node_type, "pos": [0, 0], "size": [200, 80], "flags": {}, "order": node_id,
            "mode": mode, "inputs": list(inputs), "outputs": list(outputs), "properties": {}}
    if widgets is not None:
        node["widgets_values"] = widgets
    if title is not None:
        node["title"] = title
    return node


def sock(name, type_, link=None, widget=False):
    entry = {"name": name, "type": type_, "link": link}
    if widget:
        entry["widget"] = {"name": name}
    return entry


def out(type_, links, widget=None):
    entry = {"name": type_, "type": type_, "links": links}
    if widget:
        entry["widget"] = {"name": widget}
    return entry


SEEDED_SUBGRAPH = "5f0c2f6e-0000-4000-8000-0000000000aa"


def _seeded_subgraph(nested=None, inner_id=1):
    """A subgraph with a promoted seed (input "seed" -> inner RtSeeded's seed widget) and an unpromoted base.
    (The frontend renumbers an inner node whose id a root node also has: the captured cases use ``inner_id`` 11.)"""
    inner = ui_node(inner_id, "RtSeeded", inputs=[sock("base", "INT", 201), sock("seed", "INT", 202, widget=True)],
                    outputs=[out("INT", [203])], widgets=[999, "fixed", "add", "fixed", "", "plain", 1.0, 0])
    definition = {
        "id": SEEDED_SUBGRAPH, "name": "seeded", "version": 1,
        "inputNode": {"id": -10, "bounding": [0, 0, 10, 10]}, "outputNode": {"id": -20, "bounding": [0, 0, 10, 10]},
        "inputs": [{"id": "in-base", "name": "base", "type": "INT", "linkIds": [201]},
                   {"id": "in-seed", "name": "seed", "type": "INT", "linkIds": [202]}],
        "outputs": [{"id": "out", "name": "out", "type": "INT", "linkIds": [203]}],
        "widgets": [], "nodes": [inner] + (nested or []),
        "links": [{"id": 201, "origin_id": -10, "origin_slot": 0, "target_id": inner_id, "target_slot": 0,
                   "type": "INT"},
                  {"id": 202, "origin_id": -10, "origin_slot": 1, "target_id": inner_id, "target_slot": 1,
                   "type": "INT"},
                  {"id": 203, "origin_id": inner_id, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "INT"}]}
    return definition


def _two_instances(first_mode=0, widgets=((11,), (22,)), inner_id=1):
    # as the frontend exports them: the unlinked promoted "seed" input is left off each instance's inputs
    nodes = [ui_node(1, "RtInt", outputs=[out("INT", [1, 2])], widgets=[3]),
             ui_node(2, SEEDED_SUBGRAPH, mode=first_mode, inputs=[sock("base", "INT", 1)],
                     outputs=[out("INT", [3])], widgets=list(widgets[0])),
             ui_node(3, SEEDED_SUBGRAPH, inputs=[sock("base", "INT", 2)], outputs=[out("INT", [4])],
                     widgets=list(widgets[1])),
             ui_node(4, "RtShow", inputs=[sock("value", "INT,FLOAT", 3)]),
             ui_node(5, "RtShow", inputs=[sock("value", "INT,FLOAT", 4)])]
    links = [[1, 1, 0, 2, 0, "INT"], [2, 1, 0, 3, 0, "INT"], [3, 2, 0, 4, 0, "INT"], [4, 3, 0, 5, 0, "INT"]]
    return {"nodes": nodes, "links": links, "version": 0.4, "definitions": {"subgraphs": [_seeded_subgraph(inner_id=inner_id)]}}


def _reroute_or_primitive(kind: str, mode: int) -> dict:
    """RtInt -> Reroute -> RtSeeded.base and PrimitiveNode -> RtSeeded.seed, with one of the two in ``mode``."""
    nodes = [ui_node(1, "RtInt", outputs=[out("INT", [1])], widgets=[3]),
             ui_node(2, "Reroute", mode=mode if kind == "Reroute" else 0, inputs=[sock("", "*", 1)],
                     outputs=[out("INT", [2])]),
             ui_node(3, "PrimitiveNode", mode=mode if kind == "PrimitiveNode" else 0,
                     outputs=[out("INT", [3], widget="seed")], widgets=[77, "fixed"]),
             ui_node(4, "RtSeeded", inputs=[sock("base", "INT", 2), sock("seed", "INT", 3, widget=True)],
                     outputs=[out("INT", [4])], widgets=[5, "fixed", "add", "fixed", "", "plain", 1.0, 0]),
             ui_node(5, "RtShow", inputs=[sock("value", "INT,FLOAT", 4)])]
    links = [[1, 1, 0, 2, 0, "INT"], [2, 2, 0, 4, 0, "INT"], [3, 3, 0, 4, 1, "INT"], [4, 4, 0, 5, 0, "INT"]]
    return {"last_node_id": 5, "last_link_id": 4, "nodes": nodes, "links": links, "groups": [], "config": {},
            "extra": {}, "version": 0.4}


def frontend_export_cases() -> dict:
    """{case: UI workflow}: mute (mode 2) and bypass (mode 4) on a subgraph instance, a Reroute and a
    PrimitiveNode, the places where an older frontend converted differently from the one we serve."""
    cases = {f"{word}_subgraph_instance": {**_two_instances(first_mode=mode, inner_id=11), "last_node_id": 5,
                                           "last_link_id": 4, "groups": [], "config": {}, "extra": {}}
             for word, mode in (("muted", 2), ("bypassed", 4))}
    for kind in ("Reroute", "PrimitiveNode"):
        for word, mode in (("muted", 2), ("bypassed", 4)):
            cases[f"{word}_{kind.lower()}"] = _reroute_or_primitive(kind, mode)
    return cases
