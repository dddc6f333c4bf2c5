"""LoraBindCheckpointLoader: the single files ComfyUI users already have -> the same LORABIND_MODEL handle.

Dropdowns list ComfyUI's own folders (``diffusion_models``/``unet``, ``vae``, ``text_encoders``/``clip``,
``clip_vision``) plus the
built-in tiny single files (``lorabind-tiny/...``, built offline on first use). Detection, the fit checks and
loading are ``loaders.models.single_file``'s; this node only resolves names to files.
"""

from __future__ import annotations

from pathlib import Path

from ..usecases.verbs import (
    builtin_file_names,
    ensure_builtin_files,
    gguf_denoiser_names,
    load_checkpoint_files,
    tokenizer_dirs,
)
from ..usecases.vocabulary import ROUNDINGS, SOCKET_MODEL
from . import comfy_bridge
from .comfy_bridge import folder_paths
from .model_nodes import model_placement_inputs

NO_FILE = "none"
DTYPES = ("bfloat16", "float16", "float32")


def list_files(kind: str) -> list[str]:
    """The kind's safetensors files plus the tiny single files of that kind."""
    names = set(builtin_file_names(kind))
    try:
        names.update(n for n in folder_paths().get_filename_list(kind) if n.endswith((".safetensors", ".sft")))
    except KeyError:
        pass
    return sorted(names)


def list_denoisers() -> list[str]:
    """The denoiser files: safetensors and GGUF (the published quantized sets are GGUF denoisers)."""
    return sorted(set(list_files("diffusion_models")) | set(gguf_denoiser_names(folder_paths())))


def resolve_file(kind: str, name: str) -> tuple[str, str]:
    """(path, name) of a COMBO value; a missing tiny single file is built first."""
    paths = folder_paths()
    path = paths.get_full_path(kind, name)
    if path is None and name in builtin_file_names(kind):
        roots = [Path(p) for p in paths.get_folder_paths(kind)]
        root = next((r for r in roots if r.name == kind), None)
        if root is not None:
            ensure_builtin_files({name}, root.parent)
            path = paths.get_full_path(kind, name)
    if path is None:
        path = paths.get_full_path_or_raise(kind, name)  # ComfyUI's "Model in folder ... not found" error
    return path, name


class LoraBindCheckpointLoader:
    DESCRIPTION = (
        "Loads the single files ComfyUI keeps in models/diffusion_models, models/vae and models/text_encoders "
        "(bf16, fp16, fp8_e4m3fn or fp8 scaled; denoisers also as GGUF: Q8_0, Q6_K, Q5_K, Q5_0, Q4_K, Q4_0..., "
        "kept quantized and dequantised layer by layer) as one shared model. It detects family, size and variant from "
        "the tensors and refuses files that do not fit together, naming both. For Wan2.2 A14B give the "
        "high-noise expert as denoiser and the low-noise one as denoiser_low_noise; Wan2.1 I2V also takes its CLIP "
        "vision file (models/clip_vision) as clip_vision."
    )
    CATEGORY = "lorabind/loaders"
    RETURN_TYPES = (SOCKET_MODEL, "STRING")
    RETURN_NAMES = ("model", "detected")
    OUTPUT_TOOLTIPS = ("The shared model, like the diffusers-folder loader's.",
                       "What was detected in each file (family, size, variant, expert, precision).")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        denoisers = list_denoisers()
        return {
            "required": {
                "denoiser": (denoisers, {"tooltip": "models/diffusion_models (or unet): the denoiser; for Wan2.2 "
                                                    "A14B the high-noise expert."}),
                "denoiser_low_noise": ([NO_FILE] + denoisers, {
                    "default": NO_FILE, "tooltip": "Wan2.2 A14B only: the low-noise expert file."}),
                "vae": (list_files("vae"), {"tooltip": "models/vae: wan_2.1_vae or qwen_image_vae."}),
                "text_encoder": (list_files("text_encoders"), {
                    "tooltip": "models/text_encoders (or clip): umt5_xxl for Wan, qwen_2.5_vl_7b for Qwen-Image."}),
                "dtype": (list(DTYPES), {"default": "bfloat16",
                                         "tooltip": "Compute dtype; fp8 files keep their fp8 weights in memory."}),
            },
            "optional": {
                "fp8_rounding": (list(ROUNDINGS), {
                    "default": "nearest",
                    "tooltip": "How a fused LoRA is rounded into fp8 weights (computed in float32, rounded once): "
                               "nearest, or stochastic seeded per tensor (ComfyUI's way; the same fuse always "
                               "gives the same bytes). Unbinding restores the file's exact bytes either way.",
                }),
                **model_placement_inputs(),
                # last, so the widget values of workflows saved before it keep their places
                "clip_vision": ([NO_FILE] + list_files("clip_vision"), {
                    "default": NO_FILE,
                    "tooltip": "models/clip_vision: Wan2.1 I2V only, its image encoder (clip_vision_h)."}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, denoiser, denoiser_low_noise, vae, text_encoder, dtype, fp8_rounding="nearest",
                   clip_vision=NO_FILE, **_options):
        parts = []
        for kind, name in (("diffusion_models", denoiser), ("diffusion_models", denoiser_low_noise), ("vae", vae),
                           ("text_encoders", text_encoder), ("clip_vision", clip_vision)):
            path = None if name == NO_FILE else folder_paths().get_full_path(kind, name)
            parts.append(f"{name}:{Path(path).stat().st_mtime_ns if path else 'missing'}")
        return "|".join(parts + [dtype, fp8_rounding])

    def load(self, denoiser, denoiser_low_noise, vae, text_encoder, dtype="bfloat16", fp8_rounding="nearest",
             clip_vision=NO_FILE, device="auto", memory="auto", attention="native", compile=False):
        denoisers = [resolve_file("diffusion_models", denoiser)]
        if denoiser_low_noise != NO_FILE:
            denoisers.append(resolve_file("diffusion_models", denoiser_low_noise))
        image_encoder = resolve_file("clip_vision", clip_vision) if clip_vision != NO_FILE else None
        return load_checkpoint_files(
            denoisers, resolve_file("vae", vae), resolve_file("text_encoders", text_encoder), image_encoder,
            dtype=dtype, tokenizer_dirs=tokenizer_dirs(folder_paths()), fp8_rounding=fp8_rounding,
            device=device if device != "auto" else comfy_bridge.default_device(), memory=memory,
            attention=attention, compile=compile, before_device_alloc=comfy_bridge.free_device_memory)


NODE_CLASS_MAPPINGS = {"LoraBindCheckpointLoader": LoraBindCheckpointLoader}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindCheckpointLoader": "Load Checkpoint Files (lorabind)"}
