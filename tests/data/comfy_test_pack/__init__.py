"""Test-only ComfyUI node pack (never shipped, never in a user workflow): a stand-in for ComfyUI's Wan text
encoder. ComfyUI's CLIPLoader (type wan) always builds UMT5-XXL (5.7B parameters), which a test machine cannot
afford; this node gives a CONDITIONING of the shape that encoder gives (a [1, tokens, 4096] float tensor),
seeded by the text so two prompts differ. Also the patcher probe (patcher_probe.py) and the MiniMax-H3 stand-ins
(minimax_stand_ins.py)."""

import zlib

import torch


class LoraBindTestWanConditioning:
    CATEGORY = "lorabind-test"
    FUNCTION = "encode"
    RETURN_TYPES = ("CONDITIONING",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": ""})}}

    def encode(self, text):
        generator = torch.Generator().manual_seed(zlib.crc32(text.encode("utf-8")))
        return ([[torch.randn(1, 16, 4096, generator=generator) * 0.1, {}]],)


from .minimax_stand_ins import NODE_CLASS_MAPPINGS as _MINIMAX  # noqa: E402  (ComfyUI 0.30's MiniMax-H3)
from .patcher_probe import NODE_CLASS_MAPPINGS as _PROBES  # noqa: E402  (the weight-equality probe)

NODE_CLASS_MAPPINGS = {"LoraBindTestWanConditioning": LoraBindTestWanConditioning, **_PROBES, **_MINIMAX}
