"""Adapter nodes: dynamic PEFT adapters, distill-LoRA fuses, and the Wan2.2 MoE high/low pair.

These nodes never touch a weight: they validate (file readable, every key fits the model, the declared
contract) and return a NEW handle describing the wanted state; the sampler binds it right before denoising.
So one loaded model can feed several branches with different LoRAs, and a re-run that only changes the seed
re-uses these nodes' cached handles without reading or fusing anything again.
"""

from __future__ import annotations

import os
from typing import Optional

from ..usecases.verbs import attach_adapter, attach_fuse, attach_fuses, expert_slots, file_identity
from ..usecases.vocabulary import (
    SOCKET_ADAPTER,
    SOCKET_MODEL,
    AdapterHandle,
    ComponentUnnamedError,
    LoraBindError,
    LoraFileError,
    lora_components,
)
from . import comfy_bridge

CATEGORY = "lorabind/adapters"
NONE_CHOICE = "None"
AUTO_COMPONENT = "auto"

_STRENGTH = {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01}
_STRENGTH_SCHEDULE = ("STRING", {"default": "", "tooltip": "Optional: the strength per step of the run, as "
                      "multipliers of the strength. One value per step ('1, 0.75, 0.5, 0.25') or keyframes "
                      "'step:value' interpolated between them ('0:1, 3:0' fades out over 4 steps). Empty: constant."})
_LENIENT = ("BOOLEAN", {"default": False, "tooltip": "Skip keys that match nothing in the model (they are "
                        "listed in the accounting) instead of refusing the file. Off: every key must fit."})


# --------------------------------------------------------------------------------------------------------------
# shared helpers


def lora_choices() -> list:
    """LoRA files and PEFT folders under the loras root (ComfyUI's list inside ComfyUI)."""
    return comfy_bridge.lora_names()


def resolve_lora(name: str, input_name: str, node: str) -> str:
    """Absolute path of a loras-root name; the error names the node and the input."""
    path = comfy_bridge.lora_full_path(name) if name else None
    if not path or not os.path.exists(path):
        raise LoraFileError(f"{node}: {input_name} '{name}' is not in the loras folder (a symlink to a file "
                            "outside the loras folders is refused like a name with '..')")
    return path


def lora_inputs_identity(*names: str) -> str:
    """IS_CHANGED value: (size, mtime) of each named file (every file of a PEFT folder). A missing file reads as
    its own value; the node itself reports it."""
    parts = []
    for name in names:
        if not name or name == NONE_CHOICE:
            parts.append(NONE_CHOICE)
            continue
        try:
            path = comfy_bridge.lora_full_path(name)
        except ValueError:  # a name escaping the loras root: validation refuses it with the registry's message
            path = None
        parts.append(repr(file_identity(path)) if path and os.path.exists(path) else f"missing:{name}")
    return "|".join(parts)


def _ui(attached) -> dict:
    return {
        "ui": {"lorabind_accounting": attached.accounting, "lorabind_contract": attached.contracts,
               "text": attached.text},
        "result": (attached.handle,),
    }


# --------------------------------------------------------------------------------------------------------------
# LoadPEFTAdapter


class LoadPEFTAdapter:
    SEARCH_ALIASES = ["peft adapter", "dynamic lora"]  # see SEARCH_ALIASES on FuseDistillLoRA
    DESCRIPTION = (
        "Load a PEFT adapter folder or a single LoRA file as a dynamic (unfused) adapter. Base weights are never "
        "changed: the sampler activates the adapter at 'scale' for its run only, so switching adapters or scales "
        "between branches is instant. Chain several of these nodes to stack adapters. Scale 0 turns the adapter "
        "(and any sampling contract it declares) off."
    )
    CATEGORY = CATEGORY
    FUNCTION = "load"
    RETURN_TYPES = (SOCKET_ADAPTER,)
    RETURN_NAMES = ("adapter",)
    OUTPUT_TOOLTIPS = ("The adapter stack (upstream adapters plus this one) with its scale; connect it to the "
                       "sampler's 'adapter' input.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "lora_name": (lora_choices(), {"tooltip": "PEFT folder (adapter_config.json + "
                              "adapter_model.safetensors) or .safetensors LoRA file under the loras folder."}),
                "scale": ("FLOAT", dict(_STRENGTH, tooltip="Adapter scale for the run (1.0 = as trained, "
                                        "0 = off). Applied on top of the file's own alpha/r.")),
                "component": (lora_components(), {
                    "default": lora_components()[0], "tooltip": "Denoiser the adapter attaches to: "
                    "transformer (Wan2.2: the high-noise expert) or transformer_2 (Wan2.2 low-noise expert)."}),
            },
            "optional": {
                "adapter": (SOCKET_ADAPTER, {"tooltip": "Upstream adapter stack to add this adapter to."}),
                "lenient": _LENIENT,
                "strength_schedule": _STRENGTH_SCHEDULE,
            },
        }

    @classmethod
    def IS_CHANGED(cls, lora_name="", **_):
        return lora_inputs_identity(lora_name)

    def load(self, lora_name, scale, component="", adapter: Optional[AdapterHandle] = None, lenient=False,
             strength_schedule=""):
        path = resolve_lora(lora_name, "lora_name", "LoadPEFTAdapter")
        component = component or lora_components()[0]
        return _ui(attach_adapter(lora_name, path, scale, component, adapter, lenient, strength_schedule))


# --------------------------------------------------------------------------------------------------------------
# FuseDistillLoRA


class FuseDistillLoRA:
    # More words the node search finds it by (ComfyUI's SEARCH_ALIASES; the display names rank it: see below)
    SEARCH_ALIASES = ["distill lora", "lightning lora", "lightx2v"]
    DESCRIPTION = (
        "Fuse one LoRA (typically a step-distill LoRA such as lightx2v 4-step or Qwen-Image Lightning) into the "
        "model at 'strength'. The node only validates every key against the model and records the fuse; the "
        "sampler fuses exactly (fp32, restorable) right before denoising. The LoRA's sampling contract (steps, "
        "shift, cfg) is attached and enforced by the sampler."
    )
    CATEGORY = CATEGORY
    FUNCTION = "fuse"
    RETURN_TYPES = (SOCKET_MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The same model with this fuse (and its contract) recorded; the input model is unchanged.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "Model to add the fuse to (not modified)."}),
                "lora_name": (lora_choices(), {"tooltip": "LoRA file under the loras folder."}),
                "strength": ("FLOAT", dict(_STRENGTH, tooltip="Fuse strength (1.0 = as published; 0 = the "
                                           "LoRA and its contract are off).")),
                "component": ([AUTO_COMPONENT, *lora_components()], {"default": AUTO_COMPONENT, "tooltip":
                              "Denoiser to fuse into. auto: the only transformer, or for Wan2.2 MoE the expert "
                              "the file name says (high_noise -> transformer, low_noise -> transformer_2)."}),
            },
            "optional": {"lenient": _LENIENT, "strength_schedule": _STRENGTH_SCHEDULE},
        }

    @classmethod
    def IS_CHANGED(cls, lora_name="", **_):
        return lora_inputs_identity(lora_name)

    def fuse(self, model, lora_name, strength, component=AUTO_COMPONENT, lenient=False, strength_schedule=""):
        path = resolve_lora(lora_name, "lora_name", "FuseDistillLoRA")
        chosen = None if component == AUTO_COMPONENT else component
        try:
            attached = attach_fuse(model, lora_name, path, strength, chosen, where="FuseDistillLoRA",
                                   lenient=lenient, strength_schedule=strength_schedule)
        except ComponentUnnamedError as exc:  # auto could not pick a denoiser: the pair node picks by slot
            raise ComponentUnnamedError(f"{exc}, or use WanMoELoRAPair") from None
        return _ui(attached)


# --------------------------------------------------------------------------------------------------------------
# WanMoELoRAPair


class WanMoELoRAPair:
    SEARCH_ALIASES = ["wan2.2 lora pair", "moe lora pair", "lightx2v pair"]  # see FuseDistillLoRA's
    DESCRIPTION = (
        "Attach a Wan2.2 high-noise / low-noise LoRA pair (e.g. lightx2v 4-step) to a Wan2.2 MoE model: the "
        "high-noise LoRA fuses into the high-noise expert, the low-noise one into the low-noise expert. Refuses a single-expert "
        "model and files whose names say they belong in the other slot. The pair's distill contract (from the file "
        "names) is attached and enforced by the sampler."
    )
    CATEGORY = CATEGORY
    FUNCTION = "pair"
    RETURN_TYPES = (SOCKET_MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The same model with both fuses (and their contract) recorded; the input model is "
                       "unchanged.",)

    @classmethod
    def INPUT_TYPES(cls):
        choices = [NONE_CHOICE] + lora_choices()
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "A Wan2.2 MoE model (two experts) — not modified."}),
                "high_noise_lora": (choices, {"tooltip": "LoRA for the high-noise expert (transformer), e.g. "
                                    "…high_noise…; None = no LoRA on that expert."}),
                "high_noise_strength": ("FLOAT", dict(_STRENGTH, tooltip="Strength of the high-noise LoRA.")),
                "low_noise_lora": (choices, {"tooltip": "LoRA for the low-noise expert (transformer_2), e.g. "
                                   "…low_noise…; None = no LoRA on that expert."}),
                "low_noise_strength": ("FLOAT", dict(_STRENGTH, tooltip="Strength of the low-noise LoRA.")),
            },
            "optional": {"lenient": _LENIENT, "strength_schedule": ("STRING", dict(_STRENGTH_SCHEDULE[1], tooltip=(
                _STRENGTH_SCHEDULE[1]["tooltip"] + " Multiplies both LoRAs' strengths alike.")))},
        }

    @classmethod
    def IS_CHANGED(cls, high_noise_lora=NONE_CHOICE, low_noise_lora=NONE_CHOICE, **_):
        return lora_inputs_identity(high_noise_lora, low_noise_lora)

    def pair(self, model, high_noise_lora, high_noise_strength, low_noise_lora, low_noise_strength, lenient=False,
             strength_schedule=""):
        experts = expert_slots(model)
        if experts is None:
            loaded = model.model
            raise LoraBindError(
                f"WanMoELoRAPair needs a Wan2.2 MoE model with two experts (transformer = high noise, "
                f"transformer_2 = low noise); {loaded.name} is a {loaded.family} model with components "
                f"{sorted(loaded.components)}. Use FuseDistillLoRA for a single-transformer model."
            )
        slots = []
        for input_name, name, strength, component in (
                ("high_noise_lora", high_noise_lora, high_noise_strength, experts[0]),
                ("low_noise_lora", low_noise_lora, low_noise_strength, experts[1])):
            chosen = None if name == NONE_CHOICE else name
            path = resolve_lora(name, input_name, "WanMoELoRAPair") if chosen else None
            slots.append((input_name, chosen, path, strength, component))
        return _ui(attach_fuses(model, slots, where="WanMoELoRAPair", lenient=lenient,
                                strength_schedule=strength_schedule))


NODE_CLASS_MAPPINGS = {
    "LoadPEFTAdapter": LoadPEFTAdapter,
    "FuseDistillLoRA": FuseDistillLoRA,
    "WanMoELoRAPair": WanMoELoRAPair,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    # Names of their own (no core node has them, so no pack suffix), short and starting with "LoRA": frontend 1.58
    # ranks a search match by its name or display name (its aliases only widen the match), a prefix before a
    # word and a shorter text first, and every LoraBind* class name starts with "lora" (issue 54: Save Audio,
    # LoraBindSaveAudio, ranked above the pair). Inside ComfyUI its popular core LoRA loaders still come first.
    "LoadPEFTAdapter": "LoRA Adapter",
    "FuseDistillLoRA": "LoRA Fuse",
    "WanMoELoRAPair": "LoRA Pair",
}
