"""web/lorabind.js asks the contract endpoint for the files its CONTRACT_WIDGETS table names: the table must
name every node input that chooses a LoRA/adapter or model folder, with the folder the endpoint reads and the
strength input that switches the artifact off, or the canvas silently shows nothing for that node."""

import json
import re

from lorabind.nodes import NODE_CLASS_MAPPINGS
from lorabind.nodes.adapter_nodes import lora_choices
from lorabind.nodes.editor_routes import _FOLDERS
from lorabind.nodes.model_nodes import list_model_folders
from lorabind.runtime.server.config import PACK_DIR


def web_contract_widgets() -> dict:
    source = (PACK_DIR / "web" / "lorabind.js").read_text(encoding="utf-8")
    match = re.search(r"^const CONTRACT_WIDGETS = (\{.*\});$", source, re.M)
    assert match, "web/lorabind.js: CONTRACT_WIDGETS is no longer one JSON line"
    return json.loads(match.group(1))


def _inputs(node_class) -> dict:
    spec = node_class.INPUT_TYPES()
    return {**spec.get("required", {}), **spec.get("optional", {})}


def _file_inputs(loras: set, models: set) -> set:
    """(node, input, folder) of every combo whose choices are the loras or the model folders."""
    found = set()
    for node, node_class in NODE_CLASS_MAPPINGS.items():
        for name, (kind, *_) in _inputs(node_class).items():
            if isinstance(kind, list) and loras <= set(kind):
                found.add((node, name, "loras"))
            elif isinstance(kind, list) and models <= set(kind):
                found.add((node, name, "diffusers"))
    return found


def test_the_table_names_every_file_input_with_its_folder_and_strength(registry):
    loras, models = set(lora_choices()), set(list_model_folders())
    assert loras and models
    table = web_contract_widgets()
    named = {(node, widget, folder) for node, rows in table.items() for widget, folder, _ in rows}
    assert named == _file_inputs(loras, models)
    assert {folder for _, _, folder in named} <= set(_FOLDERS)
    for node, rows in table.items():
        inputs = _inputs(NODE_CLASS_MAPPINGS[node])
        for _, _, strength in rows:
            assert strength is None or inputs[strength][0] == "FLOAT", (node, strength)
    assert table["WanMoELoRAPair"] == [["high_noise_lora", "loras", "high_noise_strength"],
                                       ["low_noise_lora", "loras", "low_noise_strength"]]
