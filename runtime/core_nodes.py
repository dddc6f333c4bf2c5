"""ComfyUI's core ``LoadImage``, ``SaveImage`` and ``PreviewImage``, for the headless runtime only.

Why: an API prompt that starts a video from an image uses ComfyUI's own ``LoadImage`` node. For the same prompt
to run in ComfyUI, in ``lorabind run`` and in ``lorabind serve``, the runtime must provide these nodes under
ComfyUI's class names, with ComfyUI's inputs, outputs and behaviour (reference ``comfyui.md``; ``nodes.py``).
Inside ComfyUI they are ComfyUI's: the pack's ``NODE_CLASS_MAPPINGS`` never contains these names (a test
checks it); only ``runtime_node_classes`` adds them, and only the runtime calls it.
"""

from __future__ import annotations

import os
import random

from .. import nodes
from ..loaders.io.atomic_files import write_atomically
from ..loaders.io.image_files import file_sha256, load_image_file
from ..nodes.output_nodes import frame_to_pil, png_metadata
from . import folder_paths

CORE_PYTHON_MODULE = "nodes"  # what ComfyUI's /object_info reports for its core nodes


class LoadImage:
    RELATIVE_PYTHON_MODULE = CORE_PYTHON_MODULE
    DESCRIPTION = "Loads an image from the input folder (upload with /upload/image), as ComfyUI's core node does."
    CATEGORY = "image"
    RETURN_TYPES = ("IMAGE", "MASK")
    FUNCTION = "load_image"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": (folder_paths.get_input_image_list(), {"image_upload": True})}}

    def load_image(self, image):
        return load_image_file(folder_paths.get_annotated_filepath(image))

    @classmethod
    def IS_CHANGED(cls, image):
        return file_sha256(folder_paths.get_annotated_filepath(image))

    @classmethod
    def VALIDATE_INPUTS(cls, image):
        # Taking ``image`` here means the value is not checked against the listed choices (ComfyUI's rule), so
        # "subfolder/name.png" and "name.png [output]" work as in ComfyUI.
        if not folder_paths.exists_annotated_filepath(image):
            return f"Invalid image file: {image}: {WHERE_IMAGES_GO}"
        return True


# Said with every image that is not found: a valid PNG elsewhere on disk fails here, and a newcomer's first
# guess is that the file is broken (issue 30). No local path: the browser shows this text.
WHERE_IMAGES_GO = ("LoadImage reads only the input folder (`--input DIR` of `lorabind run` and `lorabind serve`, "
                   "default ./input): copy the image there, or upload it with POST /upload/image, and give its name "
                   "relative to that folder (e.g. start.png or lorabind-tiny/start.png)")


class SaveImage:
    RELATIVE_PYTHON_MODULE = CORE_PYTHON_MODULE
    DESCRIPTION = "Saves each image of the batch as a PNG in the output folder, with the workflow embedded."
    CATEGORY = "image"
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save_images"
    folder_type = "output"
    extra_prefix = ""
    compress_level = 4

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "images": ("IMAGE", {"tooltip": "The images to save."}),
                "filename_prefix": ("STRING", {"default": "ComfyUI", "tooltip": "The prefix for the file to save."}),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def save_images(self, images, filename_prefix="ComfyUI", prompt=None, extra_pnginfo=None):
        """One PNG per image, ``<prefix>_<counter:05>_.png`` counting up (``%batch_num%`` in the prefix is the
        index in the batch), PNG text chunks ``prompt`` and ``workflow`` as ComfyUI writes them."""
        prefix = filename_prefix + self.extra_prefix
        folder, filename, counter, subfolder, _ = folder_paths.get_save_image_path(
            prefix, folder_paths.get_directory_by_type(self.folder_type), images.shape[2], images.shape[1])
        info = png_metadata(prompt, extra_pnginfo)
        results = []
        for batch_number, frame in enumerate(images):
            file = f"{filename.replace('%batch_num%', str(batch_number))}_{counter:05}_.png"
            picture = frame_to_pil(frame)
            write_atomically(os.path.join(folder, file),
                             lambda path, picture=picture: picture.save(path, format="PNG", pnginfo=info,
                                                                        compress_level=self.compress_level))
            results.append({"filename": file, "subfolder": subfolder, "type": self.folder_type})
            counter += 1
        return {"ui": {"images": results}}


class PreviewImage(SaveImage):
    DESCRIPTION = "Saves the images to the temp folder for preview, as ComfyUI's core node does."

    def __init__(self):
        self.folder_type = "temp"
        self.compress_level = 1
        self.extra_prefix = "_temp_" + "".join(random.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",)}, "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}


CORE_NODE_CLASS_MAPPINGS = {"LoadImage": LoadImage, "SaveImage": SaveImage, "PreviewImage": PreviewImage}
CORE_NODE_DISPLAY_NAME_MAPPINGS = {"LoadImage": "Load Image", "SaveImage": "Save Image",
                                   "PreviewImage": "Preview Image"}


def runtime_node_classes() -> tuple[dict, dict]:
    """(class mappings, display names) the headless runtime serves: the pack's nodes plus these core nodes.

    Imports the pack's node modules (and so torch); the CLI calls it only when it runs a graph.
    """
    classes = {**CORE_NODE_CLASS_MAPPINGS, **nodes.NODE_CLASS_MAPPINGS}
    names = {**CORE_NODE_DISPLAY_NAME_MAPPINGS, **nodes.NODE_DISPLAY_NAME_MAPPINGS}
    return classes, names

