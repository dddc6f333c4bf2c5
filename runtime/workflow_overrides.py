"""``lorabind run``'s changes to a workflow from the command line: ``--set NODE.INPUT=VALUE`` and
``--input-file NODE=PATH``.

Why the embedded UI workflow is changed too (issue 30): an output carries the workflow it came from
(``extra_pnginfo``), and dropping that file on the editor must bring back what actually ran, not the settings
the command line replaced (a failing step count, say). The value goes where the frontend keeps it: the node's
``widgets_values`` slot for that input. Where the frontend would take the value from elsewhere (a link, e.g. a
PrimitiveNode; a node inside a subgraph, whose definition every instance shares), the UI workflow is left as it
was and ``run`` says so.
"""

from __future__ import annotations

import copy
import json
import os

from . import folder_paths
from .node_info import node_info
from .socket_types import parse_bool
from .widget_slots import widget_slots


class OverrideError(ValueError):
    """A user-facing problem with a ``--set`` or ``--input-file`` argument."""


def apply_overrides(prompt: dict, overrides: list[str], node_classes: dict) -> dict:
    """Apply ``NODE.INPUT=VALUE`` overrides in place; unknown node ids and input names are errors.

    VALUE is parsed by the input's declared type: a BOOLEAN takes true/false, on/off, yes/no, 1/0 (any case),
    anything else is JSON, else a plain string. Returns {node_id: {input: value}}: the error text uses it so that
    a node's title from the workflow (which may name the old value) is not shown as if still true."""
    changed: dict = {}
    for item in overrides:
        target, has_value, raw = item.partition("=")
        node_id, dot, input_name = target.rpartition(".")
        if not has_value or not dot or not node_id or not input_name:
            raise OverrideError(f"--set '{item}': expected NODE.INPUT=VALUE, e.g. --set 3.seed=42")
        node = _node(prompt, node_id, f"--set '{item}'")
        declared = _declared_inputs(node_classes.get(node.get("class_type")))
        known = list(dict.fromkeys([*(node.get("inputs") or {}), *declared]))
        if input_name not in known:
            raise OverrideError(f"--set '{item}': node {node_id} ({node.get('class_type')}) has no input "
                                f"'{input_name}' (inputs: {', '.join(known)})")
        if declared.get(input_name) == "BOOLEAN":
            try:
                value = parse_bool(raw)
            except ValueError as exc:
                raise OverrideError(f"--set '{item}': input '{input_name}' of node {node_id} is a BOOLEAN: "
                                    f"{exc}") from None
        else:
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
        _set_input(prompt, node_id, input_name, value)
        changed.setdefault(node_id, {})[input_name] = value
    return changed


def apply_input_files(prompt: dict, input_files: list[str], node_classes: dict) -> tuple[dict, list[str]]:
    """``NODE=PATH``: node NODE's image input (LoadImage's ``image``) reads PATH where it is, under the file's
    own name, so nothing is copied into the input folder. Returns ({node_id: {input: name}}, lines to print)."""
    changed, lines = {}, []
    for item in input_files:
        node_id, has_path, path = item.partition("=")
        if not has_path or not node_id or not path:
            raise OverrideError(f"--input-file '{item}': expected NODE=PATH, e.g. --input-file 3=photos/start.png")
        node = _node(prompt, node_id, f"--input-file '{item}'")
        inputs = _image_file_inputs(node_classes.get(node.get("class_type")))
        if len(inputs) != 1:
            raise OverrideError(f"--input-file '{item}': node {node_id} ({node.get('class_type')}) has no image "
                                "file input (use it on a LoadImage node)")
        if not os.path.isfile(path):
            raise OverrideError(f"--input-file '{item}': '{path}' is not a file")
        name = os.path.basename(path)
        folder_paths.explicit_input_files[name] = os.path.realpath(path)
        _set_input(prompt, node_id, inputs[0], name)
        changed[node_id] = {inputs[0]: name}
        lines.append(f"node {node_id} ({node.get('class_type')}) reads {path} (as '{name}')")
    return changed, lines


def embed_overrides(workflow: dict, changed: dict, node_classes: dict, display_names: dict) -> tuple[dict, list]:
    """(a copy of the UI ``workflow`` with every changed input in its node's ``widgets_values``, notes on the
    changes it cannot hold). ``changed`` is {node_id: {input: value}}."""
    embedded = copy.deepcopy(workflow)
    nodes = {str(node.get("id")): node for node in embedded.get("nodes") or [] if isinstance(node, dict)}
    notes = []
    for node_id, inputs in changed.items():
        for input_name, value in inputs.items():
            reason = _write_widget(nodes.get(node_id), input_name, value, node_classes, display_names)
            if reason:
                notes.append(f"node {node_id} input '{input_name}': the workflow embedded in the outputs keeps its "
                             f"old value ({reason})")
    return embedded, notes


def describe_changes(changed: dict, node_id) -> list[str]:
    """``["steps=8", 'text="a fox"']``: a node's changed inputs as the user typed them (JSON values)."""
    return [f"{name}={json.dumps(value)}" for name, value in (changed or {}).get(node_id, {}).items()]


def _write_widget(node, input_name: str, value, node_classes: dict, display_names: dict) -> str:
    """Put ``value`` in the node's widget slot for ``input_name``; the reason it cannot, else ""."""
    if node is None:
        return "the node is inside a subgraph, whose definition every instance shares"
    if any(slot.get("name") == input_name and slot.get("link") is not None for slot in node.get("inputs") or []):
        return "the input is linked: the editor takes its value from the link"
    class_type = node.get("type")
    slots = widget_slots(node_info(class_type, node_classes[class_type], display_names.get(class_type)))
    if input_name not in slots:
        return "it is not one of the node's widgets"
    stored = node.get("widgets_values")
    if isinstance(stored, dict):
        stored[input_name] = value
        return ""
    stored = list(stored) if isinstance(stored, list) else []
    position = slots[input_name][0]
    if position >= len(stored):
        return "the saved node has no value for it"
    stored[position] = value
    node["widgets_values"] = stored
    return ""


def _node(prompt: dict, node_id: str, argument: str) -> dict:
    if node_id not in prompt:
        raise OverrideError(f"{argument}: the workflow has no node with id '{node_id}' "
                            f"(node ids: {', '.join(sorted(prompt))})")
    return prompt[node_id]


def _set_input(prompt: dict, node_id: str, input_name: str, value) -> None:
    node = prompt[node_id]
    prompt[node_id] = {**node, "inputs": {**(node.get("inputs") or {}), input_name: value}}


def _declared_inputs(node_class) -> dict:
    """{input name: declared type} of a node class (type is a string such as "BOOLEAN", or "COMBO")."""
    if node_class is None:
        return {}
    declared = node_class.INPUT_TYPES()
    return {name: spec[0] if isinstance(spec, (list, tuple)) and spec and isinstance(spec[0], str) else "COMBO"
            for section in ("required", "optional") for name, spec in (declared.get(section) or {}).items()}


def _image_file_inputs(node_class) -> list[str]:
    """The inputs a node reads an image file by name from (ComfyUI marks them ``image_upload``)."""
    if node_class is None:
        return []
    declared = node_class.INPUT_TYPES()
    return [name for section in ("required", "optional") for name, spec in (declared.get(section) or {}).items()
            if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict)
            and spec[1].get("image_upload")]
