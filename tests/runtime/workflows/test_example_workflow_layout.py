"""Every example workflow (UI form) opens cleanly: no node covers another at the frontend's default zoom, and each
carries a Note saying what it shows. Boxes come from the files' own pos/size; LiteGraph draws the title bar ABOVE
`pos`, so each box starts NODE_TITLE_HEIGHT higher than its pos."""

import json
from itertools import combinations
from pathlib import Path

import pytest

import lorabind

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"
UI_FILES = sorted(p for p in TEMPLATES.glob("*.json") if not p.name.endswith(".api.json"))
NODE_TITLE_HEIGHT = 30  # LiteGraph.NODE_TITLE_HEIGHT in the ComfyUI frontend
SLOT_HEIGHT, WIDGET_HEIGHT = 20, 24  # LiteGraph.NODE_SLOT_HEIGHT and a widget row incl. its margin


def _box(node):
    (x, y), (w, h) = node["pos"], node["size"]
    return x, y - NODE_TITLE_HEIGHT, x + w, y + h


def _content_height(node):
    """The least height the frontend needs for the node's slots and widgets: a stored size smaller than this would
    be grown on load and could then reach into the node below."""
    slot_rows = max(len([i for i in node.get("inputs", []) if "widget" not in i]), len(node.get("outputs", [])))
    return slot_rows * SLOT_HEIGHT + len(node.get("widgets_values") or []) * WIDGET_HEIGHT


def _intersect(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_every_example_has_a_ui_form():
    assert len(UI_FILES) >= 10


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.stem)
def test_example_nodes_do_not_overlap(path):
    nodes = json.loads(path.read_text())["nodes"]
    for node in nodes:
        assert node["size"][1] >= _content_height(node), f"{path.name}: node {node['id']} is smaller than its widgets"
    overlapping = [(a["id"], b["id"]) for a, b in combinations(nodes, 2) if _intersect(_box(a), _box(b))]
    assert overlapping == [], f"{path.name}: overlapping node ids {overlapping}"


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.stem)
def test_example_carries_a_note_saying_what_it_shows(path):
    notes = [n for n in json.loads(path.read_text())["nodes"] if n["type"] == "Note"]
    assert len(notes) == 1 and len(notes[0]["widgets_values"][0]) > 60, path.name


def test_the_overlap_check_catches_a_title_covered_by_the_node_above():
    upper = {"pos": [0, 0], "size": [320, 100]}
    assert _intersect(_box(upper), _box({"pos": [0, 120], "size": [320, 100]}))  # title bar 90..120 hits 0..100
    assert not _intersect(_box(upper), _box({"pos": [0, 131], "size": [320, 100]}))
