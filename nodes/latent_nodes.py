"""LoraBindEmptyLatent: the zero latent of a model family's shape (the start of text-to-video/image).
LoraBindImageToVideo: the start latent of image-to-video, carrying the start (and end) image's conditioning.
LoraBindVaceToVideo: the start latent of a controlled video (Wan VACE): control video, masks, reference images."""

from __future__ import annotations

from ..usecases.verbs import control_video_latent, empty_latent, image_to_video_latent
from ..usecases.vocabulary import SOCKET_IMAGE, SOCKET_LATENT, SOCKET_MODEL

MAX_RESOLUTION = 8192
# The largest empty latent accepted, estimated before any model is known with the smallest geometry any family
# has (16 channels, 8x spatial and 4x temporal compression, float32): 8192 x 8192 x 1025 frames x batch 64 would
# otherwise try to allocate about a terabyte. Real requests (720p, 81 frames, small batches) are far below.
MAX_LATENT_BYTES = 1 << 30
# (min, max, step or None) of the empty latent's size inputs: declared by INPUT_TYPES and checked by
# VALIDATE_INPUTS (which takes the executor's bound checks over), from this one table so neither rebuilds the other.
SIZE_BOUNDS = {"width": (16, MAX_RESOLUTION, 16), "height": (16, MAX_RESOLUTION, 16), "frames": (1, 1025, 4),
               "batch_size": (1, 64, None)}


def _bounds(name: str) -> dict:
    low, high, step = SIZE_BOUNDS[name]
    return {"min": low, "max": high, **({"step": step} if step is not None else {})}


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
                "width": ("INT", {"default": 64, **_bounds("width"),
                                  "tooltip": "Output width in pixels (a multiple of 16)."}),
                "height": ("INT", {"default": 64, **_bounds("height"),
                                   "tooltip": "Output height in pixels (a multiple of 16)."}),
                "frames": ("INT", {"default": 5, **_bounds("frames"),
                                   "tooltip": "Video frames (4k + 1 for Wan); ignored by image models."}),
                "batch_size": ("INT", {"default": 1, **_bounds("batch_size"),
                                       "tooltip": "Independent samples generated together."}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, width=None, height=None, frames=None, batch_size=None):
        """Refuse a latent too large to allocate before the prompt runs (linked inputs arrive as None). The
        declared min/max are checked here too: a node with VALIDATE_INPUTS gets no bound checks from the
        executor (ComfyUI's rule)."""
        if None in (width, height, frames, batch_size):
            return True
        for name, value in (("width", width), ("height", height), ("frames", frames), ("batch_size", batch_size)):
            low, high, _ = SIZE_BOUNDS[name]
            if not low <= value <= high:
                return f"{name} {value} is outside {low}..{high}"
        estimate = batch_size * 16 * ((max(frames, 1) - 1) // 4 + 1) * (height // 8) * (width // 8) * 4
        if estimate > MAX_LATENT_BYTES:
            return (f"a {width}x{height} latent of {frames} frames, batch {batch_size}, needs at least "
                    f"{estimate / 2**30:.1f} GiB (the limit is {MAX_LATENT_BYTES / 2**30:.0f} GiB): lower the size, "
                    "frames or batch")
        return True

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
        latent = image_to_video_latent(model.model, start_image, end_image, width=width, height=height,
                                       frames=frames, batch=batch_size)
        resized = [line for name, image in (("start_image", start_image), ("end_image", end_image))
                   if (line := _resize_note(name, image, width, height))]
        return {"ui": {"text": resized}, "result": (latent,)} if resized else (latent,)


class LoraBindVaceToVideo:
    DESCRIPTION = (
        "Wan VACE (Wan2.1 VACE 1.3B/14B, Wan2.2 VACE Fun experts): the start latent of a video steered by a control "
        "video (pose, depth, edges or plain frames), masks (white = generate, black = keep the control video's "
        "pixels) and reference images (subjects the video should show), as ComfyUI's WanVaceToVideo takes them. "
        "Every input is optional. Each reference image adds one latent frame in front, which decoding drops."
    )
    CATEGORY = "lorabind/latent"
    RETURN_TYPES = (SOCKET_LATENT,)
    RETURN_NAMES = ("latent",)
    OUTPUT_TOOLTIPS = ("The start latent with the VACE control; the sampler starts from seeded noise on it.",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        sizes = LoraBindImageToVideo.INPUT_TYPES()["required"]
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "A Wan VACE model (its VAE encodes the control inputs)."}),
                **{name: sizes[name] for name in ("width", "height", "frames", "batch_size")},
                "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1000.0, "step": 0.01,
                                       "tooltip": "Scale of the control hints added to the model's blocks (0: off)."}),
            },
            "optional": {
                "control_video": (SOCKET_IMAGE, {"tooltip": "Control frames (IMAGE batch), resized to width x height;"
                                                            " cut or padded with grey frames to the frame count."}),
                "control_masks": ("MASK", {"tooltip": "Per-frame masks: 1 = generate, 0 = keep the control video."}),
                "reference_images": (SOCKET_IMAGE, {"tooltip": "Up to 4 reference images, fitted inside width x "
                                                               "height on white (aspect kept)."}),
            },
        }

    VALIDATE_INPUTS = LoraBindEmptyLatent.VALIDATE_INPUTS

    def encode(self, model, width, height, frames, batch_size, strength, control_video=None, control_masks=None,
               reference_images=None):
        latent = control_video_latent(model.model, control_video, control_masks, reference_images, width=width,
                                      height=height, frames=frames, strength=strength, batch=batch_size)
        resized = [line for name, image in (("control_video", control_video), ("reference_images", reference_images))
                   if (line := _resize_note(name, image, width, height))]
        return {"ui": {"text": resized}, "result": (latent,)} if resized else (latent,)


def _resize_note(name: str, image, width: int, height: int) -> str:
    """Said when an image is not the video's size: it is stretched to width x height, and a person who gave a
    photo should know its proportions were not kept (issue 30: resizing was silent)."""
    if image is None or tuple(image.shape[1:3]) == (height, width):
        return ""
    image_height, image_width = int(image.shape[1]), int(image.shape[2])
    kept = "kept" if image_width * height == image_height * width else "not kept"
    return f"{name} {image_width}x{image_height} resized to {width}x{height} (aspect ratio {kept})"


NODE_CLASS_MAPPINGS = {"LoraBindEmptyLatent": LoraBindEmptyLatent, "LoraBindImageToVideo": LoraBindImageToVideo,
                       "LoraBindVaceToVideo": LoraBindVaceToVideo}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindEmptyLatent": "Empty Latent (lorabind)",
                              "LoraBindImageToVideo": "Image to Video (lorabind)",
                              "LoraBindVaceToVideo": "Wan VACE to Video (lorabind)"}
