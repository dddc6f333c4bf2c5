"""MiniMax-H3 nodes: attach a Turbo/native adapter with its sampling contract; decode and save the soundtrack."""

from __future__ import annotations

import os

import torch

from ..usecases.verbs import check_contract, decode_audio, with_first_frame, with_reference_images, write_wav
from ..usecases.vocabulary import (
    MAX_REFERENCE_IMAGES,
    SOCKET_AUDIO,
    SOCKET_IMAGE,
    SOCKET_LATENT,
    SOCKET_MODEL,
    SOCKET_SCHEDULE,
    SOCKET_SIGMAS,
    TASKS,
    LoraBindError,
)
from .adapter_nodes import lora_choices, lora_inputs_identity
from .comfy_bridge import folder_paths
from .output_nodes import SAVERS_CATEGORY, filename_prefix_input, output_target

CATEGORY = "lorabind/minimax_h3"


def _lora_path(lora_name: str) -> str:
    path = folder_paths().get_full_path("loras", lora_name)
    if not path or not os.path.isfile(path):
        raise LoraBindError(f"MiniMaxTurboSchedule: LoRA file {lora_name!r} is not in the loras folder")
    return path


class MiniMaxTurboSchedule:
    DESCRIPTION = (
        "Attaches a MiniMax-H3 LightX2V Turbo adapter (contract read from its published file name) or a native "
        "FlashGen adapter (contract read from its metadata) to the model, and outputs the schedule the sampler "
        "must follow. Mismatched steps, flow shifts, task or partition are refused before any weight changes."
    )
    CATEGORY = CATEGORY
    FUNCTION = "attach"
    RETURN_TYPES = (SOCKET_MODEL, SOCKET_SCHEDULE, SOCKET_SIGMAS)
    RETURN_NAMES = ("model", "schedule", "sigmas")
    OUTPUT_TOOLTIPS = (
        "The model with the adapter attached (bound dynamically by the sampler at this scale).",
        "The adapter's sampling contract; connect it to the sampler's schedule input.",
        "The video sigma schedule the contract implies (steps + 1 points ending in 0).",
    )

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "A MiniMax-H3 model (e.g. tiny-minimax-h3)."}),
                "lora_name": (lora_choices(), {
                    "tooltip": "A Turbo file with its published name (minimax_h3_<fl2v|ref2v>_turbo_<N>step_v<x.y>"
                               "[_768p][_bf16].safetensors) or a native FlashGen file.",
                }),
                "scale": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 4.0, "step": 0.01,
                                    "tooltip": "Multiplier on top of the file's alpha/rank; 0 turns the adapter "
                                               "and its contract off."}),
                "task": (["auto", *TASKS], {"default": "auto",
                                            "tooltip": "t2va / fl2va run on transformer, ref2va on "
                                                       "transformer_ref; auto = the artifact's first task."}),
            }
        }

    @classmethod
    def IS_CHANGED(cls, model, lora_name, scale, task):
        return lora_inputs_identity(lora_name)  # the contract is read from the file: re-run when it changes

    def attach(self, model, lora_name, scale, task):
        checked = check_contract(model, lora_name, lambda: _lora_path(lora_name), scale, task,
                                 where="MiniMaxTurboSchedule")
        return {
            "ui": {"lorabind_contract": [checked.view], "text": checked.text},
            "result": (checked.handle, checked.schedule, torch.tensor(checked.sigmas, dtype=torch.float32)),
        }


class MiniMaxDecodeAudio:
    DESCRIPTION = "Decodes the soundtrack of a MiniMax-H3 latent with the model's audio VAE (stereo)."
    CATEGORY = CATEGORY
    FUNCTION = "decode"
    RETURN_TYPES = (SOCKET_AUDIO,)
    RETURN_NAMES = ("audio",)
    OUTPUT_TOOLTIPS = ("Stereo waveform {waveform [B, 2, samples], sample_rate}.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The MiniMax-H3 model whose audio VAE decodes the latent."}),
                "latent": (SOCKET_LATENT, {"tooltip": "A sampled MiniMax-H3 latent (video + audio)."}),
            }
        }

    def decode(self, model, latent):
        return (decode_audio(model, latent, where="MiniMaxDecodeAudio"),)


class MiniMaxFirstFrame:
    DESCRIPTION = ("Anchors a MiniMax-H3 latent on a first frame (FL2VA): the image is encoded by the model's VAE "
                   "and held just short of clean while the rest of the video and the soundtrack are generated.")
    CATEGORY = CATEGORY
    FUNCTION = "anchor"
    RETURN_TYPES = (SOCKET_LATENT,)
    RETURN_NAMES = ("latent",)
    OUTPUT_TOOLTIPS = ("The latent with the first-frame keyframe; sample it with task fl2va.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The MiniMax-H3 model whose VAE encodes the frame."}),
                "latent": (SOCKET_LATENT, {"tooltip": "An empty MiniMax-H3 latent of the same size as the image."}),
                "image": (SOCKET_IMAGE, {"tooltip": "The first frame (its first image is used)."}),
            }
        }

    def anchor(self, model, latent, image):
        return (with_first_frame(model, latent, image, where="MiniMaxFirstFrame"),)


class MiniMaxReferenceImages:
    DESCRIPTION = ("Gives a MiniMax-H3 latent reference images (Ref2VA, run on transformer_ref): each image is resized "
                   "to the model's reference short edge, encoded by its VAE and held just short of clean while the "
                   "video and soundtrack are generated. Chain two nodes for images of different sizes.")
    CATEGORY = CATEGORY
    FUNCTION = "attach"
    RETURN_TYPES = (SOCKET_LATENT,)
    RETURN_NAMES = ("latent",)
    OUTPUT_TOOLTIPS = ("The latent with its references; sample it with task ref2va.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The MiniMax-H3 model whose VAE encodes the references."}),
                "latent": (SOCKET_LATENT, {"tooltip": "An empty MiniMax-H3 latent (references may differ in size)."}),
                "reference_images": (SOCKET_IMAGE, {
                    "tooltip": f"Reference images, one per batch item, in the order the model reads them (at most "
                               f"{MAX_REFERENCE_IMAGES} per latent, this node's and earlier ones')."}),
            }
        }

    def attach(self, model, latent, reference_images):
        return (with_reference_images(model, latent, reference_images, where="MiniMaxReferenceImages"),)


class LoraBindSaveAudio:
    DESCRIPTION = "Saves audio as 16-bit WAV with the prompt and workflow embedded (LIST/INFO ICMT chunk)."
    CATEGORY = SAVERS_CATEGORY  # with LoraBindSaveImage: any AUDIO can be saved, not only MiniMax-H3's
    FUNCTION = "save"
    RETURN_TYPES = ()
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "audio": (SOCKET_AUDIO, {"tooltip": "Audio to save, one WAV per batch item."}),
                "filename_prefix": filename_prefix_input("lorabind/audio"),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def save(self, audio, filename_prefix="lorabind/audio", prompt=None, extra_pnginfo=None):
        full_folder, filename, counter, subfolder = output_target(filename_prefix, "wav")
        comment = {"prompt": prompt, **(extra_pnginfo or {})} if prompt is not None or extra_pnginfo else None
        saved = []
        for index, waveform in enumerate(audio["waveform"]):
            file = f"{filename}_{counter + index:05}_.wav"
            write_wav(os.path.join(full_folder, file), waveform, audio["sample_rate"], comment)
            saved.append({"filename": file, "subfolder": subfolder, "type": "output"})
        return {"ui": {"audio": saved}}


NODE_CLASS_MAPPINGS = {
    "MiniMaxTurboSchedule": MiniMaxTurboSchedule,
    "MiniMaxDecodeAudio": MiniMaxDecodeAudio,
    "MiniMaxFirstFrame": MiniMaxFirstFrame,
    "MiniMaxReferenceImages": MiniMaxReferenceImages,
    "LoraBindSaveAudio": LoraBindSaveAudio,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "MiniMaxTurboSchedule": "MiniMax-H3 Turbo / Native Schedule (lorabind)",
    "MiniMaxDecodeAudio": "MiniMax-H3 Decode Audio (lorabind)",
    "MiniMaxFirstFrame": "MiniMax-H3 First Frame (lorabind)",
    "MiniMaxReferenceImages": "MiniMax-H3 Reference Images (lorabind)",
    "LoraBindSaveAudio": "Save Audio WAV (lorabind)",
}
