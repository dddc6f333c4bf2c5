"""The real-size workflows (workflows/real/) carry where their files come from, as ComfyUI's own templates do: each
has a UI form beside its API form, and each loader node there lists its files in ``properties.models`` (name, url,
directory), the shape the served frontend (1.58) reads to offer missing files for download (issue 55).

The URLs are the published table's (``loaders.placement.published``, the shipped files.json), so that the
editor, ``lorabind models download`` and ``plan`` cannot name different sources.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.placement.published import known_sources
from lorabind.runtime.commands.run import load_node_classes
from lorabind.runtime.server.comfy_api import routes_frontend
from lorabind.runtime.workflow_format import to_api_prompt
from lorabind.usecases.model_check import FILE_INPUTS

REAL = Path(lorabind.__file__).parent / "workflows" / "real"
API_FILES = sorted(REAL.glob("*.api.json"))
UI_FILES = [p.with_name(p.name.replace(".api.json", ".json")) for p in API_FILES]
# the frontend's zod object for one entry of properties.models, as its bundle spells it (names minified)
FRONTEND_MODEL_FILE = re.compile(r"\{name:\w+\(\),url:\w+\(\)\.url\(\),hash:\w+\(\)\.optional\(\),"
                                 r"hash_type:\w+\(\)\.optional\(\),directory:\w+\(\)\}")


def _inputs(prompt: dict) -> dict:
    return {node_id: (node["class_type"], node["inputs"]) for node_id, node in prompt.items()}


@pytest.mark.parametrize("ui_path, api_path", list(zip(UI_FILES, API_FILES)), ids=lambda p: p.name)
def test_the_ui_form_converts_to_the_api_form(ui_path, api_path):
    node_classes, display_names = load_node_classes()
    converted, kind = to_api_prompt(json.loads(ui_path.read_text()), node_classes, display_names)
    assert kind == "ui" and _inputs(converted) == _inputs(json.loads(api_path.read_text()))


@pytest.mark.parametrize("ui_path", UI_FILES, ids=lambda p: p.name)
def test_every_file_a_node_names_is_declared_with_its_published_url(ui_path):
    table = known_sources()
    declared_count = 0
    for node in json.loads(ui_path.read_text())["nodes"]:
        entries = node.get("properties", {}).get("models", [])
        for entry in entries:
            assert set(entry) == {"name", "url", "directory"}, (node["id"], entry)
            assert entry["url"] == table[f"{entry['directory']}/{entry['name']}"], entry  # one table, no drift
            assert entry["name"] in node["widgets_values"]  # the frontend keeps only the entries a widget names
        declared_count += len(entries)
    api = json.loads(ui_path.with_name(ui_path.name.replace(".json", ".api.json")).read_text())
    named = {(FILE_INPUTS[k], v) for node in api.values() for k, v in node["inputs"].items()
             if k in FILE_INPUTS and isinstance(v, str) and v != "none"}
    declared = {(e["directory"], e["name"]) for node in json.loads(ui_path.read_text())["nodes"]
                for e in node.get("properties", {}).get("models", [])}
    assert declared == named and declared_count == len(named)


@pytest.mark.skipif(routes_frontend.frontend_static_dir() is None,
                    reason='the ui extra is not installed (pip install "lorabind[ui]")')
def test_the_entries_have_the_shape_the_served_frontend_reads():
    """The frontend (1.58.1, the ui extra) validates each properties.models entry with one zod object: name, url
    (a URL), directory required, hash and hash_type optional. Found in its bundle, so a frontend that changes the
    shape fails here rather than silently dropping our entries."""
    bundles = (routes_frontend.frontend_static_dir() / "assets").glob("*.js")
    assert any(FRONTEND_MODEL_FILE.search(path.read_text(encoding="utf-8", errors="replace")) for path in bundles)
    for ui_path in UI_FILES:
        for node in json.loads(ui_path.read_text())["nodes"]:
            for entry in node.get("properties", {}).get("models", []):
                assert re.match(r"^https://huggingface\.co/[^/]+/[^/]+/resolve/main/.+\.(safetensors|gguf)$",
                                entry["url"]), entry
