"""Adapter nodes: dynamic PEFT adapters, distill-LoRA fuses, and the Wan2.2 MoE high/low pair.

These nodes never touch a weight: they validate (file readable, every key fits the model, the declared
contract) and return a NEW handle describing the wanted state; the sampler binds it right before denoising.
So one loaded model can feed several branches with different LoRAs, and a re-run that only changes the seed
re-uses these nodes' cached handles without reading or fusing anything again.
"""

from __future__ import annotations

import os
from typing import Optional

from ..loaders import families
from ..loaders.contracts import contract_to_dict
from ..loaders.errors import LoraBindError, LoraFileError
from ..loaders.handles import SOCKET_ADAPTER, SOCKET_MODEL, AdapterHandle, AdapterSpec, FuseSpec
from ..loaders.lora import read_lora
from ..loaders.lora.preparation import declared_contract, expert_role, prepare_lora
from ..loaders.peft_adapters import file_identity, to_peft_groups
from . import comfy_bridge

CATEGORY = "lorabind/adapters"
NONE_CHOICE = "None"
AUTO_COMPONENT = "auto"
HIGH_EXPERT, LOW_EXPERT = "transformer", "transformer_2"

_STRENGTH = {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01}
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


def accounting_text(report: dict) -> str:
    counts = report.get("counts", {})
    return (
        f"{report['lora']} -> {report['component']}: {counts.get('applied', 0)} file tensors change "
        f"{report.get('parameters', 0)} model parameters; {counts.get('expected_unmatched', 0)} expected-unmatched, "
        f"{counts.get('unmatched', 0)} unmatched"
    )


def contract_text(contract) -> list:
    """The UI line of a declared contract ([] when there is none)."""
    return [] if contract is None else ["contract: " + contract_to_dict(contract)["text"]]


def prepare_fuse(model_handle, family, name: str, path: str, strength: float, component: str, node: str,
                 lenient: bool = False):
    """One validated fuse: (FuseSpec, accounting report, declared contract or None, UI text lines)."""
    family.check_artifact(model_handle.model, os.path.basename(name), component)  # e.g. an I2V file on a T2V model
    prepared = prepare_lora(path, model_handle.model, component, name=name, lenient=lenient, where=node)
    report = prepared.report()
    contract = declared_contract(family, prepared.lora, name, strength)
    spec = FuseSpec(path=path, strength=float(strength), component=component, name=name, lenient=bool(lenient))
    return spec, report, contract, [accounting_text(report) + f" at strength {strength:g}", *contract_text(contract)]


def _ui(result, accounting: list, contracts: list, text: list) -> dict:
    return {
        "ui": {"lorabind_accounting": accounting, "lorabind_contract": contracts, "text": text},
        "result": (result,),
    }


# --------------------------------------------------------------------------------------------------------------
# LoadPEFTAdapter


class LoadPEFTAdapter:
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
                "component": ([HIGH_EXPERT, LOW_EXPERT], {"default": HIGH_EXPERT, "tooltip": "Denoiser the "
                              "adapter attaches to: transformer (Wan2.2: the high-noise expert) or transformer_2 "
                              "(Wan2.2 low-noise expert)."}),
            },
            "optional": {
                "adapter": (SOCKET_ADAPTER, {"tooltip": "Upstream adapter stack to add this adapter to."}),
                "lenient": _LENIENT,
            },
        }

    @classmethod
    def IS_CHANGED(cls, lora_name="", **_):
        return lora_inputs_identity(lora_name)

    def load(self, lora_name, scale, component=HIGH_EXPERT, adapter: Optional[AdapterHandle] = None,
             lenient=False):
        path = resolve_lora(lora_name, "lora_name", "LoadPEFTAdapter")
        # read_lora is the engine's cached reader (bind() later finds the file there); the peft conversion is
        # the one bind() uses, run here once so a file that cannot be dynamic (full diffs, convolutions) is
        # refused at this node, naming it, rather than at sampling time.
        lf = read_lora(path)
        to_peft_groups(lf.targets, lora_name)
        contract = declared_contract(families.guess_family(lf), lf, lora_name, scale)
        spec = AdapterSpec(path=path, scale=float(scale), component=component, name=lora_name,
                           lenient=bool(lenient))
        handle = (adapter or AdapterHandle()).stacked(spec, (contract,) if contract else ())
        text = [f"{lora_name} ({lf.format}) at scale {scale:g} on {component}", *contract_text(contract)]
        return _ui(handle, [], [contract_to_dict(contract)], text)


# --------------------------------------------------------------------------------------------------------------
# FuseDistillLoRA


class FuseDistillLoRA:
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
                "component": ([AUTO_COMPONENT, HIGH_EXPERT, LOW_EXPERT], {"default": AUTO_COMPONENT, "tooltip":
                              "Denoiser to fuse into. auto: the only transformer, or for Wan2.2 MoE the expert "
                              "the file name says (high_noise -> transformer, low_noise -> transformer_2)."}),
            },
            "optional": {"lenient": _LENIENT},
        }

    @classmethod
    def IS_CHANGED(cls, lora_name="", **_):
        return lora_inputs_identity(lora_name)

    def fuse(self, model, lora_name, strength, component=AUTO_COMPONENT, lenient=False):
        path = resolve_lora(lora_name, "lora_name", "FuseDistillLoRA")
        component = self._component(model, lora_name, component)
        spec, report, contract, text = prepare_fuse(model, families.for_model_family(model.family), lora_name, path,
                                                    strength, component, "FuseDistillLoRA", lenient)
        handle = model.with_fuses(spec, contracts=(contract,) if contract else ())
        return _ui(handle, [report], [contract_to_dict(contract)], text)

    @staticmethod
    def _component(model, lora_name: str, component: str) -> str:
        if component != AUTO_COMPONENT:
            return component
        if not families.has_expert_pair(model):
            return HIGH_EXPERT
        role = expert_role(lora_name)
        if role is None:
            raise LoraBindError(
                f"FuseDistillLoRA: {lora_name} does not say which expert of the Wan2.2 MoE model "
                f"{model.model.name} it is for; set component to transformer (high noise) or transformer_2 "
                f"(low noise), or use WanMoELoRAPair"
            )
        return HIGH_EXPERT if role == "high" else LOW_EXPERT


# --------------------------------------------------------------------------------------------------------------
# WanMoELoRAPair


class WanMoELoRAPair:
    DESCRIPTION = (
        "Attach a Wan2.2 high-noise / low-noise LoRA pair (e.g. lightx2v 4-step) to a Wan2.2 MoE model: the "
        "high-noise LoRA fuses into 'transformer', the low-noise one into 'transformer_2'. Refuses a single-expert "
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
            "optional": {"lenient": _LENIENT},
        }

    @classmethod
    def IS_CHANGED(cls, high_noise_lora=NONE_CHOICE, low_noise_lora=NONE_CHOICE, **_):
        return lora_inputs_identity(high_noise_lora, low_noise_lora)

    def pair(self, model, high_noise_lora, high_noise_strength, low_noise_lora, low_noise_strength, lenient=False):
        self._check_model(model)
        self._check_slots(high_noise_lora, low_noise_lora)
        family_module = families.for_model_family(model.family)
        slots = (("high_noise_lora", high_noise_lora, high_noise_strength, HIGH_EXPERT),
                 ("low_noise_lora", low_noise_lora, low_noise_strength, LOW_EXPERT))
        specs, contracts, reports, contract_dicts, text = [], [], [], [], []
        for input_name, name, strength, component in slots:
            if name == NONE_CHOICE:
                text.append(f"{input_name}: none")
                continue
            path = resolve_lora(name, input_name, "WanMoELoRAPair")
            spec, report, contract, lines = prepare_fuse(model, family_module, name, path, strength, component,
                                                         "WanMoELoRAPair", lenient)
            specs.append(spec)
            reports.append(report)
            contract_dicts.append(contract_to_dict(contract))
            text += lines
            if contract is not None:
                contracts.append(contract)
        handle = model.with_fuses(*specs, contracts=tuple(contracts)) if specs else model
        return _ui(handle, reports, contract_dicts, text)

    @staticmethod
    def _check_model(model) -> None:
        loaded = model.model
        if not families.has_expert_pair(loaded):
            raise LoraBindError(
                f"WanMoELoRAPair needs a Wan2.2 MoE model with two experts (transformer = high noise, "
                f"transformer_2 = low noise); {loaded.name} is a {loaded.family} model with components "
                f"{sorted(loaded.components)}. Use FuseDistillLoRA for a single-transformer model."
            )

    @staticmethod
    def _check_slots(high_name: str, low_name: str) -> None:
        high_role = expert_role(high_name) if high_name != NONE_CHOICE else None
        low_role = expert_role(low_name) if low_name != NONE_CHOICE else None
        if high_role == "low" or low_role == "high":
            raise LoraBindError(
                f"WanMoELoRAPair: the LoRA files are in the wrong slots: high_noise_lora is {high_name} and "
                f"low_noise_lora is {low_name}, but their names say "
                f"{_role_words(high_role)} and {_role_words(low_role)}; put the high-noise file in "
                f"high_noise_lora and the low-noise file in low_noise_lora"
            )


def _role_words(role: Optional[str]) -> str:
    return {"high": "high noise", "low": "low noise"}.get(role, "no expert")


NODE_CLASS_MAPPINGS = {
    "LoadPEFTAdapter": LoadPEFTAdapter,
    "FuseDistillLoRA": FuseDistillLoRA,
    "WanMoELoRAPair": WanMoELoRAPair,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LoadPEFTAdapter": "Load PEFT Adapter (lorabind)",
    "FuseDistillLoRA": "Fuse Distill LoRA (lorabind)",
    "WanMoELoRAPair": "Wan2.2 MoE LoRA Pair (lorabind)",
}
