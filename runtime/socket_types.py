"""ComfyUI's rules for socket types: which values a COMBO input allows, which output type a linked input
accepts, how a BOOLEAN is written.

A leaf module (imports nothing of ours) because two layers ask the same questions: the executor's validation, and
the workflow tools beside it (``workflow_format`` follows a link by type, ``workflow_overrides`` casts a --set
value). Kept out of ``runtime/executor/`` so they do not import the executor, which imports the runtime's
context: the runtime and executor folders import in one direction only.
"""

from __future__ import annotations

from typing import Any

TRUE_WORDS = ("true", "on", "yes", "1")
FALSE_WORDS = ("false", "off", "no", "0")


def parse_bool(value: Any) -> bool:
    """A BOOLEAN input the way a person writes it: true/false, on/off, yes/no, 1/0 (any case), or a JSON bool.

    Why not ``bool(value)`` as ComfyUI does: ``bool("off")`` is True, so a string from a command line or a
    hand-written prompt would silently mean the opposite. Anything else is refused with the accepted spellings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().strip("'\"").strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise ValueError(f"{value!r} is not a boolean; write one of {'/'.join(TRUE_WORDS)} or "
                     f"{'/'.join(FALSE_WORDS)} (any case)")


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
