"""Test-only ComfyUI node pack (never shipped, never in a user workflow): stand-ins for ComfyUI's Wan and Qwen-Image
text encoders. ComfyUI's CLIPLoader always builds the real encoder (type wan: UMT5-XXL, 5.7B parameters; type
qwen_image: Qwen2.5-VL-7B), which a test machine cannot afford; each stand-in gives a CONDITIONING of the shape its
encoder gives (a [1, tokens, 4096] / [1, tokens, 3584] float tensor), seeded by the text so two prompts differ.
Also the patcher probe (patcher_probe.py) and the MiniMax-H3
stand-ins (minimax_stand_ins.py)."""

import zlib

import torch


class LoraBindTestWanConditioning:
    CATEGORY = "lorabind-test"
    FUNCTION = "encode"
    RETURN_TYPES = ("CONDITIONING",)
    WIDTH = 4096  # UMT5-XXL's

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": ""})}}

    def encode(self, text):
        generator = torch.Generator().manual_seed(zlib.crc32(text.encode("utf-8")))
        return ([[torch.randn(1, 16, self.WIDTH, generator=generator) * 0.1, {}]],)


class LoraBindTestQwenImageConditioning(LoraBindTestWanConditioning):
    WIDTH = 3584  # Qwen2.5-VL-7B's hidden size, Qwen-Image's joint_attention_dim


from .minimax_stand_ins import NODE_CLASS_MAPPINGS as _MINIMAX  # noqa: E402  (ComfyUI 0.30's MiniMax-H3)
from .patcher_probe import NODE_CLASS_MAPPINGS as _PROBES  # noqa: E402  (the weight-equality probe)

NODE_CLASS_MAPPINGS = {"LoraBindTestWanConditioning": LoraBindTestWanConditioning,
                       "LoraBindTestQwenImageConditioning": LoraBindTestQwenImageConditioning, **_PROBES,
                       **_MINIMAX}
