"""What ComfyUI lists as this pack's templates, and what each carries (issues 57.2 and 54.7).

ComfyUI 0.3.64 and 0.30.0 (``app/custom_node_manager.py``, the same in both) list every ``*.json`` directly in a
pack's ``workflows``, ``example``, ``examples``, ``workflow`` or ``workflows`` folder as a template, by
file name: before, that was the 24 UI workflows and their 24 ``.api.json`` twins. Now exactly the UI templates
of ``workflows/`` are listed; each has a title and a one-line description in its first note (the served
editor's cards read them there; ComfyUI's frontend shows a pack's template by file name alone); and each
ComfyUI-native example that needs real weights names every file with ComfyUI's ``properties.models`` entry
(name, url, directory: the shape frontend 1.58 reads to offer a missing file for download).
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server.example_assets import template_card

PACK = Path(lorabind.__file__).parent
# ComfyUI's example_workflow_folder_names (app/custom_node_manager.py, 0.3.64 and 0.30.0)
COMFYUI_TEMPLATE_FOLDERS = ("example_workflows", "example", "examples", "workflow", "workflows")
TEMPLATES = sorted((PACK / "workflows").glob("*.json"))
# the file inputs of the loaders the ComfyUI-native examples use, and the folder ComfyUI finds each in
CORE_FILE_INPUTS = {"unet_name": "diffusion_models", "clip_name": "text_encoders", "vae_name": "vae",
                    "lora_name": "loras", "lora_high": "loras", "lora_low": "loras"}
# its model, text encoder and VAE names are placeholders (no file of that name is published): nothing to download
PLACEHOLDER_NAMES = {"comfy_minimax_h3_turbo_4step_768p"}


def _listed_by_comfyui(pack: Path) -> list:
    """ComfyUI's template listing for one pack: its glob, as ``get_workflow_templates`` runs it."""
    files = []
    for folder in COMFYUI_TEMPLATE_FOLDERS:
        files += glob.glob(os.path.join(str(pack.parent), f"{pack.name}/{folder}/*.json"))
    return sorted(Path(path) for path in files)


def test_comfyui_lists_exactly_the_ui_templates():
    listed = _listed_by_comfyui(PACK)
    assert listed == TEMPLATES and len(listed) == 24
    assert not [path for path in listed if path.name.endswith(".api.json")]
    for path in listed:
        workflow = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(workflow.get("nodes"), list) and isinstance(workflow.get("links"), list), path.name
    # each has its API form for scripts, out of ComfyUI's sight
    assert sorted(p.name.replace(".api.json", ".json") for p in (PACK / "workflows" / "api").glob("*.api.json")) \
        == [p.name for p in TEMPLATES]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda path: path.stem)
def test_each_template_has_a_title_and_a_one_line_description_in_its_first_note(path):
    card = template_card(json.loads(path.read_text(encoding="utf-8")), path.stem)
    assert card["title"] != path.stem and card["title"] not in ("Note", "About this workflow", "What this shows")
    assert 20 < len(card["description"]) <= 160 and card["description"].endswith(".")


@pytest.mark.parametrize("path", [p for p in TEMPLATES if p.stem.startswith("comfy_")], ids=lambda path: path.stem)
def test_a_comfyui_native_example_names_each_real_file_with_its_download(path):
    workflow = json.loads(path.read_text(encoding="utf-8"))
    api = json.loads((PACK / "workflows" / "api" / f"{path.stem}.api.json").read_text(encoding="utf-8"))
    named = {(CORE_FILE_INPUTS[key], value) for node in api.values() for key, value in node["inputs"].items()
             if key in CORE_FILE_INPUTS}
    declared = set()
    for node in workflow["nodes"]:
        for entry in node.get("properties", {}).get("models", []):
            assert set(entry) == {"name", "url", "directory"}, entry  # frontend 1.58's shape (hash optional)
            assert entry["name"] in node["widgets_values"]  # the frontend keeps only what a widget names
            assert entry["url"].startswith("https://huggingface.co/") and entry["url"].endswith("/" + entry["name"])
            declared.add((entry["directory"], entry["name"]))
    if path.stem in PLACEHOLDER_NAMES:
        assert declared == set()
        return
    assert named and declared == named
