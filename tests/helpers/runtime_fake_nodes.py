"""Small fake node classes for the runtime tests: constants, arithmetic, lists, lazy, failing.

They reach progress/interrupt through ``runtime.context`` and the model registry through
``runtime.folder_paths`` (what ``nodes.comfy_bridge`` uses headless) because importing ``lorabind.nodes`` would
import the real node modules and torch, which these tests do not need.
"""

from __future__ import annotations

import os

from lorabind.runtime import folder_paths
from lorabind.runtime.context import current_context


class RtInt:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0, "min": 0, "max": 100})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    CATEGORY = "tests"

    def run(self, value):
        return (value,)


class RtFloat:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("FLOAT", {"default": 0.5, "min": -1.0, "max": 1.0, "step": 0.1})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"

    def run(self, value):
        return (value,)


class RtAdd:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"a": ("INT", {"forceInput": True}), "b": ("INT", {"default": 1})}}

    RETURN_TYPES = ("INT",)
    RETURN_NAMES = ("sum",)
    FUNCTION = "add"

    def add(self, a, b):
        return (a + b,)


class RtSeeded:
    """Has a seed widget (control value after it in UI files) and a combo with control_after_generate."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "base": ("INT", {"forceInput": True}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**32}),
                "mode": (["add", "mul"], {"control_after_generate": True}),
                "style": ("COMBO", {"options": ["plain", "fancy"], "default": "plain"}),
                "scale": ("FLOAT", {"default": 1.0}),
            },
            "optional": {"offset": ("INT", {"default": 0})},
        }

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, base, seed, mode, style, scale, offset=0):
        value = base + seed if mode == "add" else base * seed
        return (int(value * scale) + offset + (1000 if style == "fancy" else 0),)


class RtShow:
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT,FLOAT",)}}

    RETURN_TYPES = ()
    FUNCTION = "show"

    def show(self, value):
        return {"ui": {"text": [str(value)]}}


class RtShowString:
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"forceInput": True})}}

    RETURN_TYPES = ()
    FUNCTION = "show"

    def show(self, text):
        return {"ui": {"text": [text]}}


class RtText:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"multiline": True}), "enabled": ("BOOLEAN", {"default": True})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"

    def run(self, text, enabled):
        return (text if enabled else "",)


class RtEven:
    """VALIDATE_INPUTS rejects odd values (custom_validation_failed)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"min": 0, "max": 10})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def VALIDATE_INPUTS(cls, value):
        return True if value % 2 == 0 else f"{value} is odd"

    def run(self, value):
        return (value,)


class RtLazySwitch:
    """Only the branch picked by ``use_first`` is evaluated (lazy inputs + check_lazy_status)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"use_first": ("BOOLEAN", {"default": True}),
                             "first": ("INT", {"lazy": True}), "second": ("INT", {"lazy": True})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def check_lazy_status(self, use_first, first=None, second=None):
        wanted = "first" if use_first else "second"
        return [wanted] if (first if use_first else second) is None else []

    def run(self, use_first, first=None, second=None):
        return (first if use_first else second,)


class RtFail:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value):
        raise ValueError(f"cannot handle value {value}")


class RtSteps:
    """Loops like a sampler: reports progress and checks for interrupts every step."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",), "steps": ("INT", {"default": 4, "min": 1})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value, steps):
        context = current_context()
        for step in range(1, steps + 1):
            context.check_interrupted()
            context.report_progress(step, steps)
        return (value + steps,)


class RtRange:
    """OUTPUT_IS_LIST: one call emits a list that downstream nodes consume item by item."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"count": ("INT", {"default": 3})}}

    RETURN_TYPES = ("INT",)
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "run"

    def run(self, count):
        return (list(range(1, count + 1)),)


class RtDouble:
    calls = 0

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value):
        type(self).calls += 1
        return (value * 2,)


class RtSum:
    """INPUT_IS_LIST: called once with the whole list."""

    INPUT_IS_LIST = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"values": ("INT",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, values):
        return (sum(values),)


class RtHidden:
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",)},
                "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}

    RETURN_TYPES = ()
    FUNCTION = "run"

    def run(self, value, unique_id, prompt, extra_pnginfo):
        return {"ui": {"seen": [{"value": value, "unique_id": unique_id, "prompt_nodes": sorted(prompt),
                                 "extra": extra_pnginfo}]}}


class RtAlwaysChanged:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def IS_CHANGED(cls, value):
        return float("nan")

    def run(self, value):
        return (value,)


class RtCounter:
    """Keeps state in ``self``: proves instances persist per (node_id, class_type)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    NOT_IDEMPOTENT = True

    def __init__(self):
        self.runs = 0

    @classmethod
    def IS_CHANGED(cls, value):
        return float("nan")

    def run(self, value):
        self.runs += 1
        return (self.runs,)


class RtSaveText:
    """Writes a text file to the output folder and reports it as an ``images``-style UI entry."""

    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT,FLOAT",), "filename_prefix": ("STRING", {"default": "rt"})}}

    RETURN_TYPES = ()
    FUNCTION = "save"

    def save(self, value, filename_prefix):
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(
            filename_prefix, folder_paths.get_output_directory())
        filename = f"{name}_{counter:05}_.txt"
        with open(os.path.join(folder, filename), "w", encoding="utf-8") as handle:
            handle.write(str(value))
        return {"ui": {"images": [{"filename": filename, "subfolder": subfolder, "type": "output"}]}}


FAKE_NODES = {cls.__name__: cls for cls in (
    RtInt, RtFloat, RtAdd, RtSeeded, RtShow, RtShowString, RtText, RtEven, RtLazySwitch, RtFail, RtSteps,
    RtRange, RtDouble, RtSum, RtHidden, RtAlwaysChanged, RtCounter, RtSaveText,
)}
