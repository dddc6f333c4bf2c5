"""LoraBindTextEncode: a prompt -> LORABIND_CONDITIONING with the model's own tokenizer and text encoder.
LoraBindTextEncodeImageEdit: a prompt read together with input images (image-editing models)."""

from __future__ import annotations

from ..usecases.verbs import encode_text, encode_with_images
from ..usecases.vocabulary import SOCKET_CONDITIONING, SOCKET_IMAGE, SOCKET_MODEL


class LoraBindTextEncode:
    DESCRIPTION = (
        "Encodes a prompt with the text encoder that ships with the model (UMT5 for Wan, Qwen2.5-VL for "
        "Qwen-Image), using the pipeline's own template and padding. The result depends only on the model "
        "and the text, so the executor caches it across runs."
    )
    CATEGORY = "lorabind/conditioning"
    RETURN_TYPES = (SOCKET_CONDITIONING,)
    RETURN_NAMES = ("conditioning",)
    OUTPUT_TOOLTIPS = ("Text embeddings for this model family (positive or negative input of the sampler).",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The model whose text encoder encodes the prompt."}),
                "text": ("STRING", {"multiline": True, "dynamicPrompts": True, "default": "",
                                    "tooltip": "The prompt (or the negative prompt)."}),
            }
        }

    def encode(self, model, text):
        return (encode_text(model.model, text),)


class LoraBindTextEncodeImageEdit:
    DESCRIPTION = (
        "Encodes an edit instruction together with the input image(s), for image-editing models (Qwen-Image-Edit: "
        "one image; Edit-2509/2511: up to three). The vision-language encoder reads the images in the prompt, and "
        "their VAE latents go with the conditioning to every sampler step. Encode the negative prompt with the same "
        "images. The output text says how each image was resized (the pipeline's own rules)."
    )
    CATEGORY = "lorabind/conditioning"
    RETURN_TYPES = (SOCKET_CONDITIONING,)
    RETURN_NAMES = ("conditioning",)
    OUTPUT_TOOLTIPS = ("The instruction and the images for this model (positive or negative input of the sampler).",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        image = "An input image (ComfyUI IMAGE; its first frame). Resized by the model's own rules."
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "An image-editing model (its text encoder reads the images)."}),
                "text": ("STRING", {"multiline": True, "dynamicPrompts": True, "default": "",
                                    "tooltip": "The edit instruction (or the negative prompt)."}),
                "image_1": (SOCKET_IMAGE, {"tooltip": image}),
            },
            "optional": {
                "image_2": (SOCKET_IMAGE, {"tooltip": image + " Edit-2509/2511 only."}),
                "image_3": (SOCKET_IMAGE, {"tooltip": image + " Edit-2509/2511 only."}),
            },
        }

    def encode(self, model, text, image_1, image_2=None, image_3=None):
        images = [image for image in (image_1, image_2, image_3) if image is not None]
        conditioning, notes = encode_with_images(model.model, text, images)
        return {"ui": {"text": notes}, "result": (conditioning,)}


NODE_CLASS_MAPPINGS = {"LoraBindTextEncode": LoraBindTextEncode,
                       "LoraBindTextEncodeImageEdit": LoraBindTextEncodeImageEdit}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindTextEncode": "Text Encode (lorabind)",
                              "LoraBindTextEncodeImageEdit": "Text Encode with Images (lorabind)"}
