"""Test-only MiniMax-H3 nodes (never shipped): ComfyUI 0.30's MiniMax-H3 text encoder is Qwen3-VL-32B cut to 50
layers (``CLIPLoader`` type minimax), and its video VAE a full-size one, which a test machine cannot afford.
``LoraBindTestMiniMaxConditioning`` gives the CONDITIONING that encoder gives in shape (``[1, tokens, width]``,
the tiny model's text width), seeded by the text; ``LoraBindTestLatentStats`` stands in for decoding: it reports
the sampled joint latent's video and audio shapes and whether every value is finite."""

import zlib

import torch


class LoraBindTestMiniMaxConditioning:
    CATEGORY = "lorabind-test"
    FUNCTION = "encode"
    RETURN_TYPES = ("CONDITIONING",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": ""}), "width": ("INT", {"default": 16, "min": 1})}}

    def encode(self, text, width):
        generator = torch.Generator().manual_seed(zlib.crc32(text.encode("utf-8")))
        return ([[torch.randn(1, 8, width, generator=generator) * 0.1, {}]],)


class LoraBindTestLatentStats:
    CATEGORY = "lorabind-test"
    FUNCTION = "stats"
    OUTPUT_NODE = True
    RETURN_TYPES = ()

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",)}}

    def stats(self, samples):
        latent = samples["samples"]
        parts = list(latent.tensors) if hasattr(latent, "tensors") else [latent]
        report = {"shapes": [list(part.shape) for part in parts],
                  "finite": all(bool(torch.isfinite(part).all()) for part in parts),
                  "abs_mean": [float(part.float().abs().mean()) for part in parts]}
        return {"ui": {"latent": [report]}}


NODE_CLASS_MAPPINGS = {"LoraBindTestMiniMaxConditioning": LoraBindTestMiniMaxConditioning,
                       "LoraBindTestLatentStats": LoraBindTestLatentStats}
