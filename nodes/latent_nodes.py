"""LoraBindEmptyLatent: the zero latent of a model family's shape (the start of text-to-video/image)."""

from __future__ import annotations

from ..loaders.generation import empty_latent
from ..loaders.handles import SOCKET_LATENT, SOCKET_MODEL

MAX_RESOLUTION = 8192


class LoraBindEmptyLatent:
    DESCRIPTION = (
        "An empty latent sized for the model: Wan video latents have 16 channels with 8x spatial and 4x temporal "
        "compression (frames = 4k + 1); Qwen-Image latents are single images. Defaults suit the built-in tiny "
        "models."
    )
    CATEGORY = "lorabind/latent"
    RETURN_TYPES = (SOCKET_LATENT,)
    RETURN_NAMES = ("latent",)
    OUTPUT_TOOLTIPS = ("The empty latent; the sampler starts from seeded noise on it.",)
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The model the latent is for (decides its shape)."}),
                "width": ("INT", {"default": 64, "min": 16, "max": MAX_RESOLUTION, "step": 16,
                                  "tooltip": "Output width in pixels (a multiple of 16)."}),
                "height": ("INT", {"default": 64, "min": 16, "max": MAX_RESOLUTION, "step": 16,
                                   "tooltip": "Output height in pixels (a multiple of 16)."}),
                "frames": ("INT", {"default": 5, "min": 1, "max": 1025, "step": 4,
                                   "tooltip": "Video frames (4k + 1 for Wan); ignored by image models."}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 64,
                                       "tooltip": "Independent samples generated together."}),
            }
        }

    def generate(self, model, width, height, frames, batch_size):
        return (empty_latent(model.model, width=width, height=height, frames=frames, batch=batch_size),)


NODE_CLASS_MAPPINGS = {"LoraBindEmptyLatent": LoraBindEmptyLatent}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindEmptyLatent": "Empty Latent (lorabind)"}
