"""LoraBindVAEDecode (latent -> IMAGE) and LoraBindSaveImage (PNG / animated WebP with the workflow embedded).

The metadata layout is ComfyUI's own, so files saved headless drag-and-drop back into ComfyUI: PNG text chunks
``prompt`` and one per ``extra_pnginfo`` key (``workflow``); animated WebP carries them in EXIF, ``prompt:<json>``
in tag 0x0110 (Model) and ``<key>:<json>`` from tag 0x010F (Make) downwards, like SaveAnimatedWEBP.
"""

from __future__ import annotations

import json
import os

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from ..usecases.verbs import decode, write_atomically
from ..usecases.vocabulary import SOCKET_IMAGE, SOCKET_LATENT, SOCKET_MODEL
from .comfy_bridge import folder_paths

SAVERS_CATEGORY = "lorabind/output"  # every node that writes files (images, audio)

EXIF_PROMPT_TAG = 0x0110
EXIF_FIRST_EXTRA_TAG = 0x010F


class LoraBindVAEDecode:
    DESCRIPTION = "Decodes a latent with the model's own VAE (de-normalised exactly as the diffusers pipelines do)."
    CATEGORY = "lorabind/latent"
    RETURN_TYPES = (SOCKET_IMAGE,)
    RETURN_NAMES = ("images",)
    OUTPUT_TOOLTIPS = ("Frames as ComfyUI IMAGE: float [frames, height, width, 3] in 0..1.",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The model whose VAE decodes the latent."}),
                "latent": (SOCKET_LATENT, {"tooltip": "The sampled latent."}),
            }
        }

    def decode(self, model, latent):
        return (decode(model.model, latent),)


def filename_prefix_input(default: str) -> tuple:
    """The ``filename_prefix`` widget every saver declares."""
    return ("STRING", {"default": default, "tooltip": "File name prefix; may contain subfolders (a/b)."})


def output_target(filename_prefix: str, extension: str, width: int = 0, height: int = 0
                  ) -> tuple[str, str, int, str]:
    """(folder, file stem, first free counter, subfolder) of a ``.extension`` save under the output directory;
    the folder is created.

    The counter is the first free one among files of this extension only. ComfyUI counts every extension, so a
    run that saves a video and its soundtrack under one prefix gets ``_00001_.webp`` and ``_00002_.wav``; here
    the outputs of one run share their number."""
    registry = folder_paths()
    full_folder, filename, _, subfolder, _ = registry.get_save_image_path(
        filename_prefix, registry.get_output_directory(), width, height
    )
    os.makedirs(full_folder, exist_ok=True)
    stem, suffix = os.path.normcase(filename) + "_", os.path.normcase(f"_.{extension}")
    taken = [name[len(stem):-len(suffix)] for name in map(os.path.normcase, os.listdir(full_folder))
             if name.startswith(stem) and name.endswith(suffix)]
    counter = max((int(digits) + 1 for digits in taken if digits.isdigit()), default=1)
    return full_folder, filename, counter, subfolder


def frame_to_pil(frame) -> Image.Image:
    array = np.clip(frame.float().cpu().numpy() * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return Image.fromarray(array)


def png_metadata(prompt, extra_pnginfo) -> PngInfo:
    info = PngInfo()
    if prompt is not None:
        info.add_text("prompt", json.dumps(prompt))
    for key, value in (extra_pnginfo or {}).items():
        info.add_text(key, json.dumps(value))
    return info


def webp_exif(first_frame: Image.Image, prompt, extra_pnginfo) -> Image.Exif:
    exif = first_frame.getexif()
    if prompt is not None:
        exif[EXIF_PROMPT_TAG] = "prompt:{}".format(json.dumps(prompt))
    tag = EXIF_FIRST_EXTRA_TAG
    for key, value in (extra_pnginfo or {}).items():
        exif[tag] = "{}:{}".format(key, json.dumps(value))
        tag -= 1
    return exif


class LoraBindSaveImage:
    DESCRIPTION = (
        "Saves to the output folder: one frame as PNG, several frames as an animated WebP. The API prompt and "
        "the UI workflow are embedded the way ComfyUI does, so the file loads back into ComfyUI."
    )
    CATEGORY = SAVERS_CATEGORY
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "images": (SOCKET_IMAGE, {"tooltip": "Frames to save (one frame -> PNG, more -> animated WebP)."}),
                "filename_prefix": filename_prefix_input("lorabind"),
                "fps": ("FLOAT", {"default": 16.0, "min": 0.01, "max": 1000.0, "step": 0.01,
                                  "tooltip": "Frame rate of an animated WebP."}),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def save(self, images, filename_prefix="lorabind", fps=16.0, prompt=None, extra_pnginfo=None):
        frames = [frame_to_pil(frame) for frame in images]
        width, height = frames[0].size
        animated = len(frames) > 1
        full_folder, filename, counter, subfolder = output_target(filename_prefix, "webp" if animated else "png",
                                                                  width, height)
        if animated:
            file = f"{filename}_{counter:05}_.webp"
            exif = webp_exif(frames[0], prompt, extra_pnginfo)
            write_atomically(os.path.join(full_folder, file), lambda path: frames[0].save(
                path, format="WEBP", save_all=True, append_images=frames[1:], duration=int(1000.0 / fps),
                loop=0, exif=exif, lossless=False, quality=90, method=4,
            ))
        else:
            file = f"{filename}_{counter:05}_.png"
            info = png_metadata(prompt, extra_pnginfo)
            write_atomically(os.path.join(full_folder, file), lambda path: frames[0].save(
                path, format="PNG", pnginfo=info, compress_level=4,
            ))
        image = {"filename": file, "subfolder": subfolder, "type": "output"}
        return {"ui": {"images": [image], "animated": [animated]}}


NODE_CLASS_MAPPINGS = {"LoraBindVAEDecode": LoraBindVAEDecode, "LoraBindSaveImage": LoraBindSaveImage}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LoraBindVAEDecode": "VAE Decode (lorabind)",
    "LoraBindSaveImage": "Save Image / Animated WebP (lorabind)",
}
