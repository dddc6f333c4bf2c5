"""LoraBindEmptyLatent: the zero latent of a model family's shape (the start of text-to-video/image).
LoraBindImageToVideo: the start latent of image-to-video, carrying the start (and end) image's conditioning."""

from __future__ import annotations

from ..loaders.generation import empty_latent, image_to_video_latent
from ..loaders.handles import SOCKET_IMAGE, SOCKET_LATENT, SOCKET_MODEL

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


class LoraBindImageToVideo:
    DESCRIPTION = (
        "Image-to-video: encodes a start image (and optionally an end image) the way the model is conditioned. "
        "Wan2.2 I2V A14B: the VAE-encoded frames and a frame mask are concatenated to the noise at every step. "
        "Wan2.1 I2V: the same, plus the CLIP vision encoder's image states. Wan2.2 TI2V-5B: the encoded start "
        "image is the first latent frame, kept fixed. Feed the latent to the sampler; the prompts stay as they are."
    )
    CATEGORY = "lorabind/latent"
    RETURN_TYPES = (SOCKET_LATENT,)
    RETURN_NAMES = ("latent",)
    OUTPUT_TOOLTIPS = ("The start latent with the image conditioning; the sampler starts from seeded noise on it.",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "An image-to-video model (its VAE and image encoder are used)."}),
                "start_image": (SOCKET_IMAGE, {"tooltip": "The first frame (ComfyUI IMAGE; e.g. from LoadImage). "
                                                          "Resized to width x height."}),
                "width": ("INT", {"default": 32, "min": 16, "max": MAX_RESOLUTION, "step": 16,
                                  "tooltip": "Video width in pixels (a multiple of 16; 32 for Wan2.2 TI2V)."}),
                "height": ("INT", {"default": 32, "min": 16, "max": MAX_RESOLUTION, "step": 16,
                                   "tooltip": "Video height in pixels (a multiple of 16; 32 for Wan2.2 TI2V)."}),
                "frames": ("INT", {"default": 5, "min": 1, "max": 1025, "step": 4,
                                   "tooltip": "Video frames (4k + 1)."}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 64,
                                       "tooltip": "Independent samples generated together from the same image."}),
            },
            "optional": {
                "end_image": (SOCKET_IMAGE, {"tooltip": "Optional last frame (first-and-last-frame video; Wan2.2 "
                                                        "I2V and Wan2.1 FLF2V)."}),
            },
        }

    def encode(self, model, start_image, width, height, frames, batch_size, end_image=None):
        return (image_to_video_latent(model.model, start_image, end_image, width=width, height=height,
                                      frames=frames, batch=batch_size),)


NODE_CLASS_MAPPINGS = {"LoraBindEmptyLatent": LoraBindEmptyLatent, "LoraBindImageToVideo": LoraBindImageToVideo}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindEmptyLatent": "Empty Latent (lorabind)",
                              "LoraBindImageToVideo": "Image to Video (lorabind)"}
