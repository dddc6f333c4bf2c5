"""ComfyUI's rules for socket types: which values a COMBO input allows, and which output type a linked input
accepts.

A leaf module (imports nothing of ours) because two layers ask the same question: the executor's validation, and
the UI-to-API workflow conversion (``workflow_format``) when it follows a link by type. Kept out of
``runtime/executor/`` so the conversion does not import the executor, which imports the runtime's context:
the runtime and executor folders import in one direction only.
"""

from __future__ import annotations

from typing import Any


def combo_options(input_type: Any, extra_info: dict) -> list | None:
    """The allowed values of a COMBO input in either form: a list type, or ``"COMBO"`` with ``options``."""
    if isinstance(input_type, (list, tuple)):
        return list(input_type)
    if input_type == "COMBO":
        return list(extra_info.get("options", []))
    return None


def types_compatible(received: Any, expected: Any) -> bool:
    """ComfyUI's validate_node_input (non-strict): equal, or comma-separated type sets overlapping."""
    if received == expected or expected == "*" or received == "*":
        return True
    if combo_options(expected, {}) is not None and combo_options(received, {}) is not None:
        return True
    if not isinstance(received, str) or not isinstance(expected, str):
        return False
    received_set = {part.strip() for part in received.split(",")}
    expected_set = {part.strip() for part in expected.split(",")}
    return bool(received_set & expected_set)
