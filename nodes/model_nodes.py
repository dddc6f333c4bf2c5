"""LoraBindModelLoader: a diffusers model folder -> LORABIND_MODEL handle (shared pipeline + pinned contracts)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..usecases.verbs import (
    find_model,
    list_models,
    load_model,
    load_repository_model,
    model_version,
    repository_files_stat,
    resolve_model,
)
from ..usecases.vocabulary import ATTENTION_NAMES, DTYPE_NAMES, MEMORY_NAMES, SOCKET_MODEL, device_choices
from . import comfy_bridge
from .comfy_bridge import WorkProgress, folder_paths


def list_model_folders() -> list[str]:
    """The loader's choices: every model folder under the ``diffusers`` roots plus the built-in tiny models."""
    return list_models(folder_paths())


def find_model_folder(model_name: str) -> Optional[Path]:
    """The existing folder a COMBO value names, confined to the ``diffusers`` roots (None when absent)."""
    return find_model(folder_paths(), model_name)


def resolve_model_folder(model_name: str) -> Path:
    """The folder to load, a missing built-in tiny model built first (``usecases.models.resolve_model``)."""
    return resolve_model(folder_paths(), model_name)


def model_placement_inputs() -> dict:
    """The optional device/memory/attention/compile inputs every model loader shares (same semantics, same
    session defaults)."""
    return {
        "device": (device_choices(), {
            "default": "auto",
            "tooltip": "Where the model runs. auto: ComfyUI's device inside ComfyUI, `lorabind run/serve "
                       "--device` headless, else CUDA, then MPS, then the CPU.",
        }),
        "memory": (list(MEMORY_NAMES), {
            "default": "auto",
            "tooltip": "Memory plan. auto picks the cheapest that fits the free device memory: full "
                       "(everything resident), swap_experts (Wan2.2: one expert on the device at a time), "
                       "offload_model (each component on the device only while used), offload_blocks "
                       "(stream transformer blocks). A plan that cannot fit is refused before loading.",
        }),
        "attention": (list(ATTENTION_NAMES), {
            "default": "native",
            "tooltip": "Attention kernel (diffusers' attention dispatcher): native is torch SDPA; flash, "
                       "flash3, sage, xformers need their package and CUDA; cudnn needs CUDA.",
        }),
        "compile": ("BOOLEAN", {
            "default": False,
            "tooltip": "torch.compile the repeated transformer blocks (diffusers' regional compilation): "
                       "slower first run, faster steps after.",
        }),
    }


class LoraBindModelLoader:
    DESCRIPTION = (
        "Loads a diffusers model folder (Wan2.1, Wan2.2 MoE, Qwen-Image, MiniMax-H3) once and shares it between "
        "every branch of the graph. LoRA nodes downstream never modify it: the sampler binds the exact LoRA "
        "state each branch asks for. Built-in tiny models are built offline on first use."
    )
    CATEGORY = "lorabind/loaders"
    RETURN_TYPES = (SOCKET_MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The shared model plus the sampling contract its checkpoint pins, if any.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model_name": (list_model_folders(), {
                    "tooltip": "A folder under models/diffusers containing model_index.json "
                               "(tiny-* are the built-in offline test models), or a repository id "
                               "(Wan-AI/Wan2.2-T2V-A14B-Diffusers) whose published single files `lorabind models "
                               "download` put in the model folders.",
                }),
                "dtype": (list(DTYPE_NAMES), {
                    "default": "auto",
                    "tooltip": "Weight dtype: auto keeps the folder's own; bfloat16 halves memory on GPUs.",
                }),
            },
            # Optional so that API prompts written before these inputs existed still validate and run.
            "optional": {
                **model_placement_inputs(),
                "max_cached_adapters": ("INT", {
                    "default": 0, "min": 0, "max": 64,
                    "tooltip": "How many dynamic (PEFT) adapters this model keeps injected for fast switching; "
                               "0 = the default (4, or `lorabind serve --max-cached-adapters`).",
                }),
            },
        }

    @classmethod
    def IS_CHANGED(cls, model_name, dtype, **_options):
        """Re-run when any file of the folder changes (``model_version``: rebuilt, replaced, rewritten in place;
        missing folder: the name itself). The value is embedded with the prompt in outputs, so it names the folder
        by its relative name, never by path."""
        try:
            version = model_version(folder_paths(), model_name)
        except ValueError:
            version = None
        if version is None:
            files = repository_files_stat(folder_paths(), model_name)
            return f"{model_name}:{files or 'missing'}:{dtype}"
        return f"{model_name}:{version}:{dtype}"

    def load(self, model_name, dtype="auto", device="auto", memory="auto", attention="native", compile=False,
             max_cached_adapters=0):
        if find_model_folder(model_name) is None:  # a repository id: its published single files
            handle = load_repository_model(
                folder_paths(), model_name, dtype="bfloat16" if dtype == "auto" else dtype,
                device=device if device != "auto" else comfy_bridge.default_device(), memory=memory,
                attention=attention, compile=compile, before_device_alloc=comfy_bridge.free_device_memory)
            if handle is not None:
                return (handle,)
        folder = resolve_model_folder(model_name)
        # placing components is work, not sampling steps: ComfyUI clients count every `progress` message as a step
        placing = WorkProgress("placing model components")
        handle = load_model(
            folder, name=model_name, max_cached_adapters=max_cached_adapters, dtype=dtype,
            device=device if device != "auto" else comfy_bridge.default_device(), memory=memory,
            attention=attention, compile=compile, on_progress=placing.update,
            before_device_alloc=comfy_bridge.free_device_memory)
        return (handle,)


NODE_CLASS_MAPPINGS = {"LoraBindModelLoader": LoraBindModelLoader}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindModelLoader": "Load Diffusers Model (lorabind)"}
