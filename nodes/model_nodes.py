"""LoraBindModelLoader: a diffusers model folder -> LORABIND_MODEL handle (shared pipeline + pinned contracts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..loaders.binding import set_adapter_cache_size
from ..loaders.devices import MEMORY_NAMES, device_choices
from ..loaders.families import checkpoint_contracts
from ..loaders.handles import SOCKET_MODEL, ModelHandle
from ..loaders.model_store import DTYPE_NAMES, load_model
from ..loaders.speed import ATTENTION_NAMES
from ..loaders.tiny_models import BUILTIN_NAMES, build_builtin, needs_build
from . import comfy_bridge
from .comfy_bridge import ProgressBar, folder_paths

MODEL_FOLDER_KIND = "diffusers"


def _diffusers_roots() -> list[Path]:
    return [Path(p) for p in folder_paths().get_folder_paths(MODEL_FOLDER_KIND)]


def list_model_folders() -> list[str]:
    """Every folder with a ``model_index.json`` under the ``diffusers`` roots (relative, ``/``-separated), plus
    the built-in tiny models, which the loader builds on first use (so a fresh install works offline)."""
    names = set(BUILTIN_NAMES)
    for root in _diffusers_roots():
        if not root.is_dir():
            continue
        for current, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            if "model_index.json" in files:
                names.add(Path(current).relative_to(root).as_posix())
                dirs[:] = []  # a pipeline's subfolders are its components, not more models
    names.discard(".")
    return sorted(names)


def find_model_folder(model_name: str) -> Optional[Path]:
    """The existing folder a COMBO value names, confined to the ``diffusers`` roots (None when absent)."""
    relative = Path(model_name.replace("\\", "/"))
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ValueError(f"model_name {model_name!r}: must be a folder name under models/{MODEL_FOLDER_KIND}")
    for root in _diffusers_roots():
        if (root / relative / "model_index.json").is_file():
            return root / relative
    return None


def resolve_model_folder(model_name: str) -> Path:
    """``find_model_folder``, building a missing (or stale, see ``needs_build``) built-in tiny model first;
    otherwise a missing folder raises."""
    folder = find_model_folder(model_name)
    if folder is not None and not (model_name in BUILTIN_NAMES and needs_build(folder)):
        return folder
    roots = _diffusers_roots()
    default_root = next((r for r in roots if r.name == MODEL_FOLDER_KIND), None)
    if model_name in BUILTIN_NAMES and default_root is not None:
        return build_builtin(model_name, default_root.parent)  # builders write <models root>/diffusers/<name>
    searched = ", ".join(str(r) for r in roots) or "(no diffusers folder configured)"
    raise FileNotFoundError(f"model_name {model_name!r}: no {model_name}/model_index.json under {searched}")


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
                               "(tiny-* are the built-in offline test models).",
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
        """Re-run when the folder is rebuilt: the model_index.json mtime (missing folder: the name itself). The
        value is embedded with the prompt in outputs, so it names the folder by its relative name, never by path."""
        try:
            folder = find_model_folder(model_name)
        except ValueError:
            folder = None
        if folder is None:
            return f"{model_name}:missing:{dtype}"
        stat = (folder / "model_index.json").stat()
        return f"{model_name}:{stat.st_size}:{stat.st_mtime_ns}:{dtype}"

    def load(self, model_name, dtype="auto", device="auto", memory="auto", attention="native", compile=False,
             max_cached_adapters=0):
        folder = resolve_model_folder(model_name)
        progress = ProgressBar(1)
        comfy_bridge.install_unload_hook()
        model = load_model(folder, name=model_name, dtype=dtype, device=device if device != "auto" else
                           comfy_bridge.default_device(), memory=memory, attention=attention, compile=compile,
                           on_progress=lambda done, total: progress.update_absolute(done, total=total),
                           before_device_alloc=comfy_bridge.free_device_memory)
        if max_cached_adapters:
            set_adapter_cache_size(model, max_cached_adapters)
        return (ModelHandle(model, contracts=checkpoint_contracts(model)),)


NODE_CLASS_MAPPINGS = {"LoraBindModelLoader": LoraBindModelLoader}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindModelLoader": "Load Diffusers Model (lorabind)"}
