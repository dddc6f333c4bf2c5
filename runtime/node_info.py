"""ComfyUI V1 ``/object_info`` entries for node classes (ComfyUI's server.py::node_info, same keys and rules).

Used by the HTTP server's ``/object_info`` and by the UI->API workflow converter, which maps positional
``widgets_values`` through ``input`` / ``input_order`` exactly as the ComfyUI frontend sees them.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    """Tuples become lists (what JSON would give), so entries compare equal to their JSON round trip."""
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def node_info(class_type: str, cls, display_name: str | None = None, python_module: str | None = None) -> dict:
    """The ``/object_info`` entry of one V1 node class; ``display_name`` defaults to the class key.

    ``python_module`` is what ComfyUI would have put in the class's ``RELATIVE_PYTHON_MODULE`` when loading it
    (``custom_nodes.<pack folder>``); the frontend reads it to tell a pack's nodes from core ones (``nodes``)."""
    input_types = cls.INPUT_TYPES()
    return_types = tuple(getattr(cls, "RETURN_TYPES", ()))
    info: dict[str, Any] = {
        "input": _jsonable(input_types),
        "input_order": {section: list(entries.keys()) for section, entries in input_types.items()},
        "output": _jsonable(return_types),
        "output_is_list": _jsonable(getattr(cls, "OUTPUT_IS_LIST", [False] * len(return_types))),
        "output_name": _jsonable(getattr(cls, "RETURN_NAMES", return_types)),
        "name": class_type,
        "display_name": display_name or class_type,
        "description": getattr(cls, "DESCRIPTION", ""),
        "python_module": getattr(cls, "RELATIVE_PYTHON_MODULE", None) or python_module or "nodes",
        "category": getattr(cls, "CATEGORY", "sd"),
        "output_node": getattr(cls, "OUTPUT_NODE", False) is True,
    }
    if hasattr(cls, "OUTPUT_TOOLTIPS"):
        info["output_tooltips"] = _jsonable(cls.OUTPUT_TOOLTIPS)
    if getattr(cls, "DEPRECATED", False):
        info["deprecated"] = True
    if getattr(cls, "EXPERIMENTAL", False):
        info["experimental"] = True
    if hasattr(cls, "API_NODE"):
        info["api_node"] = cls.API_NODE
    if getattr(cls, "SEARCH_ALIASES", None):
        info["search_aliases"] = list(cls.SEARCH_ALIASES)
    return info


def object_info(node_classes: dict, display_names: dict | None = None, python_module: str | None = None) -> dict:
    """``{class_type: node_info}`` for every class; a class whose INPUT_TYPES raises is logged and skipped
    (ComfyUI does the same so one broken node cannot take the whole endpoint down). The ComfyUI-native nodes
    (``COMFYUI_ONLY``) are not offered: they take ComfyUI's own MODEL, which nothing headless gives; they stay
    registered, so a prompt naming one is refused by name ("needs ComfyUI")."""
    display_names = display_names or {}
    result = {}
    for class_type, cls in node_classes.items():
        if getattr(cls, "COMFYUI_ONLY", False):  # needs ComfyUI's own MODEL: nothing here can feed it
            continue
        try:
            result[class_type] = node_info(class_type, cls, display_names.get(class_type), python_module)
        except Exception:
            log.exception("object_info: skipping node %s", class_type)
    return result
