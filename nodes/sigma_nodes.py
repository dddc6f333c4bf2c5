"""Sigma nodes: a schedule (a contract's table, or steps + shift) as ComfyUI SIGMAS, and a split of one.

Why: staged recipes (the three-stage Wan2.2 Lightning workflow, KSamplerAdvanced-style splits) wire SIGMAS
between samplers; these give our contract-resolved schedules to ComfyUI's sigma nodes and samplers and back.
"""

from __future__ import annotations

import torch

from ..usecases.verbs import schedule_sigmas, split_sigmas
from ..usecases.vocabulary import MAX_STEPS, SOCKET_ADAPTER, SOCKET_MODEL, SOCKET_SCHEDULE, SOCKET_SIGMAS


def _tensor(points) -> torch.Tensor:
    return torch.tensor([float(p) for p in points], dtype=torch.float32)


def _show(points) -> str:
    return "[" + ", ".join(f"{float(p):.4f}" for p in points) + "]"


class LoraBindSigmas:
    DESCRIPTION = ("The sigma schedule a LoraBind Sampler with these steps and shift would run on this model, as "
                   "ComfyUI SIGMAS: the contract's table when the model carries a distill LoRA (a mismatching "
                   "steps or shift is refused by name), else the flow-matching grid shifted by shift.")
    CATEGORY = "lorabind/sampling"
    FUNCTION = "sigmas"
    RETURN_TYPES = (SOCKET_SIGMAS,)
    RETURN_NAMES = ("sigmas",)
    OUTPUT_TOOLTIPS = ("steps + 1 sigmas ending in 0.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The model with its LoRAs (their contracts decide the table)."}),
                "steps": ("INT", {"default": 4, "min": 0, "max": MAX_STEPS,
                                  "tooltip": "Steps; 0 = what the connected contract declares."}),
                "shift": ("FLOAT", {"default": 5.0, "min": 0.0, "max": 100.0, "step": 0.1,
                                    "tooltip": "Flow-matching time shift."}),
                "enforce_contract": ("BOOLEAN", {"default": True,
                                                 "tooltip": "Refuse steps/shift that break a contract."}),
            },
            "optional": {
                "adapter": (SOCKET_ADAPTER, {"tooltip": "Dynamic adapters whose contracts count too."}),
                "schedule": (SOCKET_SCHEDULE, {"tooltip": "A schedule contract."}),
            },
        }

    def sigmas(self, model, steps, shift, enforce_contract=True, adapter=None, schedule=None):
        resolved = schedule_sigmas(model, steps, shift, adapter=adapter, schedule=schedule,
                                   enforce=enforce_contract)
        sources = ", ".join(c.source for c in resolved.contracts) or f"shift {resolved.shift:g}"
        return {"ui": {"text": [f"sigmas {_show(resolved.sigmas)} ({sources})"]},
                "result": (_tensor(resolved.sigmas),)}


class LoraBindSplitSigmas:
    DESCRIPTION = ("Split SIGMAS in two at a step, or where sigma drops below a boundary (the Wan2.2 expert "
                   "switch). Both parts keep the split point, as ComfyUI's SplitSigmas: the second sampler "
                   "continues where the first stopped.")
    CATEGORY = "lorabind/sampling"
    FUNCTION = "split"
    RETURN_TYPES = (SOCKET_SIGMAS, SOCKET_SIGMAS, "INT")
    RETURN_NAMES = ("first", "second", "split_step")
    OUTPUT_TOOLTIPS = ("Steps before the split (ends at the split sigma).",
                       "Steps from the split on (starts at the split sigma).",
                       "The step the second part starts at (a sampler's start_step / end_step).")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "sigmas": (SOCKET_SIGMAS, {"tooltip": "The schedule to split."}),
            "step": ("INT", {"default": 1, "min": 0, "max": MAX_STEPS, "tooltip": "Split at this step (boundary 0)."}),
            "boundary": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.005, "tooltip": (
                "Above 0: split where sigma first drops below it instead (Wan2.2 T2V A14B: 0.875).")}),
        }}

    def split(self, sigmas, step, boundary):
        first, second, at = split_sigmas([float(s) for s in sigmas], step, boundary)
        return {"ui": {"text": [f"split at step {at}: {_show(first)} + {_show(second)}"]},
                "result": (_tensor(first), _tensor(second), at)}


NODE_CLASS_MAPPINGS = {"LoraBindSigmas": LoraBindSigmas, "LoraBindSplitSigmas": LoraBindSplitSigmas}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindSigmas": "Sigmas (lorabind)", "LoraBindSplitSigmas": "Split Sigmas (lorabind)"}
