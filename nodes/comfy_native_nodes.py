"""ComfyUI-native nodes: our LoRA engine and contracts on ComfyUI's own ``MODEL``, sampled by ComfyUI's samplers.

Why: a ComfyUI user's workflow is made of core nodes (UNETLoader, ModelSamplingSD3, KSamplerAdvanced, ...). These
nodes slot into it: our reader and key accounting turn a LoRA file into deltas under the model's own parameter
names, which are added to a clone of the model as ComfyUI patches (so ComfyUI's patcher, offload and low-VRAM paths
apply them), and the file's contract travels with the model as a sampler wrapper that checks any ComfyUI sampler
run (sigmas, sampler, task) before its first step and its guidance at every step (``comfy_guidance``). They work
only inside ComfyUI (headless there is no such MODEL).
"""

from __future__ import annotations

import os
from functools import partial

from ..usecases.verbs import (
    check_expert_pair,
    check_lora_expert,
    check_sampling,
    check_stacking,
    check_step,
    host_expert,
    host_family,
    host_patched_value,
    prepare_host_lora,
    sigma_table,
    switch_step,
)
from ..usecases.vocabulary import PART_ANY, PART_HIGH, PART_LOW, HostContract, LoraBindError, LoraFileError
from . import comfy_bridge, comfy_guidance, comfy_patches
from .adapter_nodes import lora_choices, lora_inputs_identity, resolve_lora

CATEGORY = "lorabind/ComfyUI models"
CONTRACTS_ATTACHMENT = "lorabind_contracts"  # the contracts a MODEL carries (ModelPatcher attachments)
CHECK_WRAPPER_KEY = "lorabind_contract_check"
EXPERT_ATTACHMENT = "lorabind_expert"  # PART_HIGH / PART_LOW on an expert MODEL a pair node returned

_STRENGTH = ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01,
                       "tooltip": "LoRA strength (1.0 = as trained; 0 = off, and its contract too)."})
_LENIENT = ("BOOLEAN", {"default": False, "tooltip": "Skip keys that match nothing in the model (they are listed "
                        "in the accounting) instead of refusing the file. Off: every key must fit."})
_ENFORCE = ("BOOLEAN", {"default": True, "tooltip": "Check the sampler's sigmas and cfg against the LoRA's "
                        "contract before the first step. Off: sampled anyway, and the override is recorded."})


def prepare_lora(model, lora_name: str, strength: float, lenient: bool, where: str, input_name: str = "lora_name",
                 expert: bool = False):
    """Our read + key accounting of ``lora_name`` against ComfyUI's ``model``: nothing patched yet. ``expert``: the
    model is known to be one expert of a pair."""
    comfy_bridge.require_comfyui(where)
    path = resolve_lora(lora_name, input_name, where)
    return prepare_host_lora(comfy_patches.model_shapes(model), f"{where} model", lora_name, path, strength,
                             lenient=lenient, where=where, dtypes=comfy_patches.model_dtypes(model), expert=expert)


def _which_expert(model, where: str):
    """``host_expert`` of a ComfyUI MODEL: the part a pair node gave it, else what its file's name says."""
    family = host_family(comfy_patches.model_shapes(model), f"{where} model")
    part = model.get_attachment(EXPERT_ATTACHMENT) or ""
    return family, host_expert(family, model_part=part, model_file=comfy_patches.model_file_name(model))


def apply_lora(model, prepared, lora_name: str, strength: float, enforce: bool, part: str = "", switch=None,
               where: str = "LoraBindLoRA"):
    """(a clone of ``model`` with the LoRA's deltas as ComfyUI patches and its contract attached, UI lines)."""
    check_stacking(prepared.deltas, comfy_patches.patched_keys(model), lora_name, where)
    patched = model.clone()
    if part in (PART_HIGH, PART_LOW):  # which expert it is, for a LoRA node after this one
        patched.set_attachments(EXPERT_ATTACHMENT, part)
    computes = {key: partial(_patched_weight, patch) for key, patch in prepared.deltas.items()}
    taken = comfy_patches.add_weight_patches(patched, computes, strength, lora_name)
    if taken != len(computes):  # our names come from this model's state dict: a difference is a bug to report
        raise LoraBindError(f"ComfyUI took {taken} of the {len(computes)} patches of {lora_name}")
    records = tuple(patched.get_attachment(CONTRACTS_ATTACHMENT) or ())
    lines = list(prepared.text)
    if prepared.contract is not None:
        record = HostContract(prepared.contract, part or PART_ANY, switch, bool(enforce))
        records += (record,)
        lines.append(record.describe())
    _set_contracts(patched, records)
    comfy_bridge.WorkProgress(lines[0]).update(1, 1)  # the accounting as the node's progress text
    return patched, lines


def _one_lora_node(model, name: str, strength: float, lenient: bool, enforce: bool, where: str, input_name: str):
    """What a single-LoRA node returns: the patched clone, and the accounting as its ``ui`` text. A LoRA whose name
    says the other expert than the MODEL is refused first, as the pair node refuses a swapped pair."""
    comfy_bridge.require_comfyui(where)
    family, expert = _which_expert(model, where)
    if expert is not None:
        check_lora_expert(family, name, where, input_name, expert)
    prepared = prepare_lora(model, name, strength, lenient, where, input_name, expert=expert is not None)
    patched, lines = apply_lora(model, prepared, name, strength, enforce, where=where)
    return {"ui": {"text": lines, "lorabind_accounting": [prepared.report]}, "result": (patched,)}


def _patched_weight(patch, weight, strength):
    return host_patched_value(weight, patch, strength)


def _set_contracts(model, records: tuple) -> None:
    model.set_attachments(CONTRACTS_ATTACHMENT, records)
    if records:
        logged = set()  # each override once per model, not once per step
        comfy_guidance.add_sample_check(model, CHECK_WRAPPER_KEY, partial(_check_run, records, logged),
                                        partial(_check_step, records, logged))


def _check_run(records, logged: set, run) -> None:
    _log_overrides(check_sampling(records, run), logged)


def _check_step(records, logged: set, guidance, sigma=None) -> None:
    _log_overrides(check_step(records, guidance, sigma), logged)


def _log_overrides(lines, logged: set) -> None:
    for line in lines:
        if line not in logged:
            logged.add(line)
            print(f"[lorabind] {line}")  # an override is recorded in ComfyUI's log, never silent


def _sigmas(values):
    import torch

    return torch.tensor(list(values or ()), dtype=torch.float32)


class LoraBindLoRA:
    SEARCH_ALIASES = ["lora on comfyui model"]  # beside ComfyUI's own LoraLoaderModelOnly, not above it
    COMFYUI_ONLY = True  # it works on ComfyUI's own MODEL: `lorabind serve`'s editor does not offer it
    DESCRIPTION = (
        "Apply a LoRA to ComfyUI's own MODEL with lorabind's engine: every layout and adapter kind, every file "
        "tensor accounted for (an unmatched key is an error unless 'lenient'), applied as ComfyUI patches on a "
        "clone. The file's sampling contract travels with the model and is checked on any ComfyUI sampler "
        "before its first step."
    )
    CATEGORY = CATEGORY
    FUNCTION = "apply"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("A clone of the model with the LoRA as patches and its contract attached.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL", {"tooltip": "ComfyUI's MODEL (UNETLoader, ...) — not modified."}),
            "lora_name": (lora_choices(), {"tooltip": "LoRA file or PEFT folder under the loras folder."}),
            "strength": _STRENGTH, "lenient": _LENIENT, "enforce_contract": _ENFORCE}}

    @classmethod
    def IS_CHANGED(cls, lora_name="", **_):
        return lora_inputs_identity(lora_name)

    def apply(self, model, lora_name, strength, lenient=False, enforce_contract=True):
        return _one_lora_node(model, lora_name, strength, lenient, enforce_contract, "LoraBindLoRA", "lora_name")


class LoraBindLoRAPair:
    SEARCH_ALIASES = ["lora pair on comfyui models"]
    COMFYUI_ONLY = True
    DESCRIPTION = (
        "A Wan2.2 high-noise / low-noise LoRA pair on ComfyUI's two expert MODELs. Swapped files are refused by "
        "name. Also out: the pair's contract sigmas split at the expert boundary and the switch step, for "
        "SamplerCustomAdvanced or KSamplerAdvanced's start/end steps; each expert's sampler must run its part."
    )
    CATEGORY = CATEGORY
    FUNCTION = "pair"
    RETURN_TYPES = ("MODEL", "MODEL", "SIGMAS", "SIGMAS", "INT")
    RETURN_NAMES = ("model_high", "model_low", "sigmas_high", "sigmas_low", "switch_step")
    OUTPUT_TOOLTIPS = ("High-noise expert with its LoRA.", "Low-noise expert with its LoRA.",
                       "The contract's sigmas the high-noise expert samples (empty without a contract).",
                       "The contract's sigmas the low-noise expert samples (empty without a contract).",
                       "The step where the low-noise expert takes over (KSamplerAdvanced end / start step).")

    @classmethod
    def INPUT_TYPES(cls):
        choices = lora_choices()
        return {"required": {
            "model_high": ("MODEL", {"tooltip": "The high-noise expert (…high_noise… file)."}),
            "model_low": ("MODEL", {"tooltip": "The low-noise expert (…low_noise… file)."}),
            "lora_high": (choices, {"tooltip": "LoRA for the high-noise expert."}),
            "lora_low": (choices, {"tooltip": "LoRA for the low-noise expert."}),
            "strength_high": _STRENGTH, "strength_low": _STRENGTH,
            "boundary": ("FLOAT", {"default": 0.875, "min": 0.0, "max": 1.0, "step": 0.005, "tooltip":
                         "Sigma below which the low-noise expert runs: Wan2.2 T2V A14B 0.875, I2V A14B 0.9."}),
            "lenient": _LENIENT, "enforce_contract": _ENFORCE}}

    @classmethod
    def IS_CHANGED(cls, lora_high="", lora_low="", **_):
        return lora_inputs_identity(lora_high, lora_low)

    def pair(self, model_high, model_low, lora_high, lora_low, strength_high, strength_low, boundary,
             lenient=False, enforce_contract=True):
        where = "LoraBindLoRAPair"
        comfy_bridge.require_comfyui(where)
        family = host_family(comfy_patches.model_shapes(model_high), f"{where} model_high")
        check_expert_pair(family, lora_high, lora_low, where)  # by name, before any file is read
        high = prepare_lora(model_high, lora_high, strength_high, lenient, where, "lora_high", expert=True)
        low = prepare_lora(model_low, lora_low, strength_low, lenient, where, "lora_low", expert=True)
        contract = high.contract or low.contract
        table = sigma_table(contract) if contract is not None else None
        switch = switch_step(table, boundary) if table else 0
        model_high, high_lines = self._expert(model_high, high, lora_high, strength_high, lenient, enforce_contract,
                                              PART_HIGH, switch)
        model_low, low_lines = self._expert(model_low, low, lora_low, strength_low, lenient, enforce_contract,
                                            PART_LOW, switch)
        lines = high_lines + low_lines
        if table:
            lines.append(f"switch at step {switch} of {len(table) - 1} (boundary {boundary:g})")
        ui = {"text": lines, "lorabind_accounting": [high.report, low.report]}
        sigmas_high, sigmas_low = (table[:switch + 1], table[switch:]) if table else ((), ())
        return {"ui": ui, "result": (model_high, model_low, _sigmas(sigmas_high), _sigmas(sigmas_low), switch)}

    def _expert(self, model, prepared, lora: str, strength: float, lenient: bool, enforce: bool, part: str,
                switch: int):
        """The patched clone of one expert, and its lines: the one this node returned last time when nothing of
        that expert changed (the same input MODEL, file, strength and options). Why: ComfyUI re-patches a MODEL it
        has not seen, so a new clone of the unchanged expert after one strength change cost a second full patch
        of it (twice ComfyUI's own two LoRA nodes' time, bench_comfyui); the same object is already patched.
        Node instances persist per node id, as the sampler's plan does."""
        kept = getattr(self, "_kept", {})
        key = (lora, lora_inputs_identity(lora), float(strength), bool(lenient), bool(enforce), switch)
        if part in kept and kept[part][0] is model and kept[part][1] == key:
            return kept[part][2]
        applied = apply_lora(model, prepared, lora, strength, enforce, part, switch, "LoraBindLoRAPair")
        self._kept = {**kept, part: (model, key, applied)}
        return applied


class LoraBindPEFTAdapter:
    COMFYUI_ONLY = True
    DESCRIPTION = (
        "Apply a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) to ComfyUI's own MODEL with "
        "PEFT's scale rules: lora_alpha/r, or lora_alpha/sqrt(r) with use_rslora, and per-module rank_pattern / "
        "alpha_pattern. ComfyUI's own loader reads only the weight file, without its config. Applied as ComfyUI "
        "patches on a clone, every tensor accounted for, like LoraBindLoRA."
    )
    CATEGORY = CATEGORY
    FUNCTION = "apply"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("A clone of the model with the adapter as patches (and any contract it declares).",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL", {"tooltip": "ComfyUI's MODEL (UNETLoader, ...) — not modified."}),
            "adapter_name": (comfy_bridge.peft_folder_names(), {
                "tooltip": "PEFT adapter folder under the loras folder (the folder, not its weight file)."}),
            "scale": ("FLOAT", dict(_STRENGTH[1], tooltip="Adapter scale (1.0 = as trained), applied on top of "
                                    "the scale the adapter config gives each module; 0 = off.")),
            "lenient": _LENIENT, "enforce_contract": _ENFORCE}}

    @classmethod
    def IS_CHANGED(cls, adapter_name="", **_):
        return lora_inputs_identity(adapter_name)

    def apply(self, model, adapter_name, scale, lenient=False, enforce_contract=True):
        where = "LoraBindPEFTAdapter"
        comfy_bridge.require_comfyui(where)
        if not os.path.isdir(resolve_lora(adapter_name, "adapter_name", where)):
            raise LoraFileError(f"{where}: adapter_name '{adapter_name}' is a single file, not a PEFT adapter "
                                f"folder; apply LoRA files with LoraBindLoRA")
        return _one_lora_node(model, adapter_name, scale, lenient, enforce_contract, where, "adapter_name")


class LoraBindContractSigmas:
    COMFYUI_ONLY = True
    DESCRIPTION = ("The sampling contract's sigma table of the LoRAs on a MODEL (from LoraBindLoRA / "
                   "LoraBindLoRAPair), as SIGMAS for SamplerCustomAdvanced.")
    CATEGORY = CATEGORY
    FUNCTION = "sigmas"
    RETURN_TYPES = ("SIGMAS",)
    RETURN_NAMES = ("sigmas",)
    OUTPUT_TOOLTIPS = ("steps + 1 sigmas ending in 0, as the contract declares them.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL", {"tooltip": "A MODEL with a contract attached by our LoRA nodes."})}}

    def sigmas(self, model):
        comfy_bridge.require_comfyui("LoraBindContractSigmas")
        records = model.get_attachment(CONTRACTS_ATTACHMENT) or ()
        tables = [sigma_table(record.contract) for record in records]
        tables = [table for table in tables if table]
        if not tables:
            raise LoraBindError("LoraBindContractSigmas: the MODEL carries no LoRA with a sigma contract (apply a "
                                "distill LoRA with LoraBindLoRA or LoraBindLoRAPair first)")
        text = [f"sigmas {', '.join(f'{s:.4f}' for s in tables[0])} ({records[0].contract.source})"]
        return {"ui": {"text": text}, "result": (_sigmas(tables[0]),)}


NODE_CLASS_MAPPINGS = {
    "LoraBindLoRA": LoraBindLoRA,
    "LoraBindLoRAPair": LoraBindLoRAPair,
    "LoraBindPEFTAdapter": LoraBindPEFTAdapter,
    "LoraBindContractSigmas": LoraBindContractSigmas,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LoraBindLoRA": "LoRA on ComfyUI MODEL (lorabind)",
    "LoraBindLoRAPair": "Wan2.2 LoRA Pair on ComfyUI MODELs (lorabind)",
    "LoraBindPEFTAdapter": "PEFT Adapter on ComfyUI MODEL (lorabind)",
    "LoraBindContractSigmas": "Contract Sigmas (lorabind)",
}
