"""Tiny fake nodes for the server tests: fast, step-looping (interruptible), failing and image-writing."""

from __future__ import annotations

import time

from lorabind.nodes import comfy_bridge


class SrvCountSteps:
    """Loops ``steps`` times, reporting progress and honouring interrupts between steps (like a sampler)."""

    CATEGORY = "test"
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"steps": ("INT", {"default": 3, "min": 1, "max": 10000}),
                             "delay": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 10.0})}}

    def run(self, steps, delay):
        bar = comfy_bridge.ProgressBar(steps)
        for step in range(steps):
            comfy_bridge.check_interrupted()
            time.sleep(delay)
            bar.update_absolute(step + 1)
        return (steps,)


class SrvSaveImage:
    """Output node: writes a small PNG whose size encodes ``value`` and returns ComfyUI's images ui dict."""

    CATEGORY = "test"
    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1, "min": 0, "max": 10000}),
                             "prefix": ("STRING", {"default": "srv"})}}

    def save(self, value, prefix):
        from PIL import Image

        folder = comfy_bridge.folder_paths().get_output_directory()
        name = f"{prefix}_{value:05d}.png"
        Image.new("RGB", (value + 1, 2), (200, 10, 30)).save(f"{folder}/{name}")
        return {"ui": {"images": [{"filename": name, "subfolder": "", "type": "output"}], "value": [value]}}


class SrvFail:
    CATEGORY = "test"
    RETURN_TYPES = ()
    FUNCTION = "fail"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1, "min": 0, "max": 10})}}

    def fail(self, value):
        raise ValueError(f"SrvFail refuses value {value}")


FAKE_NODES = {"SrvCountSteps": SrvCountSteps, "SrvSaveImage": SrvSaveImage, "SrvFail": SrvFail}


def count_and_save(steps=3, delay=0.0, prefix="srv"):
    """API prompt: count ``steps`` then save an image sized by the count."""
    return {"1": {"class_type": "SrvCountSteps", "inputs": {"steps": steps, "delay": delay}},
            "2": {"class_type": "SrvSaveImage", "inputs": {"value": ["1", 0], "prefix": prefix}}}
