"""Where a node's widget values sit in a UI workflow's positional ``widgets_values``, by the frontend's rules.

Why a module of its own: the UI -> API conversion (``workflow_format``) and ``lorabind run --set`` on a UI
workflow (``workflow_overrides``) both read and write those positions; the rules (declared order, ``forceInput``
inputs skipped, hidden control values after seed / ``control_after_generate`` widgets, the defaults a new widget
starts with) are the frontend's (reference comfyui.md §5) and must be read the same way by both.
"""

from __future__ import annotations

from typing import Any

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
SEED_NAMES = ("seed", "noise_seed")  # INT widgets that get a control widget when the spec does not say


def is_combo(input_type: Any) -> bool:
    return isinstance(input_type, list) or input_type == "COMBO"


def control_values_after(name: str, input_type: Any, options: dict) -> int:
    """How many hidden values the frontend stores after this widget's value in ``widgets_values``."""
    control = options.get("control_after_generate")
    if input_type == "INT":
        if control is None:
            control = name in SEED_NAMES
        return 1 if control else 0
    if is_combo(input_type) and control:
        return 2  # the control mode and the combo filter-list string
    return 0


def widget_default(spec) -> Any:
    """The value a new widget starts with in the frontend: the spec's default, else the first combo option,
    0 for numbers, "" for strings and false for booleans."""
    input_type = spec[0]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if "default" in options:
        return options["default"]
    if isinstance(input_type, list):
        return input_type[0] if input_type else None
    if input_type == "COMBO":
        choices = options.get("options") or []
        return choices[0] if choices else None
    return {"INT": 0, "FLOAT": 0.0, "STRING": "", "BOOLEAN": False}.get(input_type)


def widget_slots(info: dict) -> dict:
    """{widget input name: (its index in a list-form ``widgets_values``, its spec)} for a node's ``/object_info``
    entry, in the frontend's order: declared order, ``forceInput`` inputs skipped, hidden control values after
    seed / ``control_after_generate`` widgets counted."""
    slots, position = {}, 0
    for section in ("required", "optional"):
        declared = info["input"].get(section) or {}
        for name in info["input_order"].get(section, []):
            spec = declared[name]
            input_type = spec[0]
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if (is_combo(input_type) or input_type in WIDGET_TYPES) and not options.get("forceInput", False):
                slots[name] = (position, spec)
                position += 1 + control_values_after(name, input_type, options)
    return slots
