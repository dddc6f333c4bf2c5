"""LoraBindTextEncode: a prompt -> LORABIND_CONDITIONING with the model's own tokenizer and text encoder."""

from __future__ import annotations

from ..usecases import SOCKET_CONDITIONING, SOCKET_MODEL, encode_text


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


NODE_CLASS_MAPPINGS = {"LoraBindTextEncode": LoraBindTextEncode}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindTextEncode": "Text Encode (lorabind)"}
