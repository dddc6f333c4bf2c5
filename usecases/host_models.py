"""LoRAs and contracts on a host's own model (ComfyUI's ``MODEL``), for the ComfyUI-native nodes.

Why a use-case module: which denoiser a file's keys fit, the key accounting, the declared contract, the expert
slot check are the same rules our own model path applies; a host model differs only in that the host's patcher
writes the weights. So the nodes hand over what the host model exposes (state-dict names and shapes, what says
which expert it is) and get back deltas under the host's names, contract records and refusals in our words. The
sampler run's check is ``host_sampling``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..loaders import families
from ..loaders.contracts.schedule_rules import sigma_table  # noqa: F401  (API)
from ..loaders.contracts.sigmas import switch_step  # noqa: F401  (API)
from ..loaders.dispatch.contract_discovery import contract_to_dict, discover_contract
from ..loaders.errors import ComponentUnnamedError, KeyMatchError, LoraBindError
from ..loaders.families.roles import ROLE_HIGH_NOISE, ROLE_LOW_NOISE
from ..loaders.models.native_targets import host_deltas, native_denoiser, prepare_native
from .adapters import accounting_text, contract_text

PART_ALL, PART_HIGH, PART_LOW, PART_ANY = "all", "high", "low", "any contiguous part"


@dataclass(frozen=True)
class HostContract:
    """A contract travelling with a host model: which part of its sigma table this model may sample (``part``,
    and for an expert the step where the pair switches), and whether it is enforced."""

    contract: object  # ScheduleContract
    part: str = PART_ANY
    switch_step: Optional[int] = None
    enforced: bool = True

    def describe(self) -> str:
        state = "enforced" if self.enforced else "NOT enforced (enforce_contract off)"
        return f"contract {state}: {contract_to_dict(self.contract)['text']}"


@dataclass
class HostLora:
    """One LoRA prepared for a host model: ``deltas`` {host key: HostPatch} (its ``deltas``, its ``value``), the
    accounting report, the declared contract (None when none) and the text lines a node shows."""

    deltas: dict
    report: dict
    contract: object = None
    text: list = field(default_factory=list)


def prepare_host_lora(shapes: dict, model_name: str, lora_name: str, path: str, strength: float, *,
                      lenient: bool, where: str, dtypes: Optional[dict] = None, expert: bool = False) -> HostLora:
    """Read, map and account the LoRA for the host denoiser described by ``shapes`` ({state-dict key: shape}) and
    ``dtypes`` ({state-dict key: dtype name}, what the host stores: patched values are rounded to them as our
    fuse rounds, so the host's own rounding changes nothing). ``expert``: the host model is known to be one expert
    of a two-expert model (``host_expert``, a pair node), which its messages then say."""
    denoiser = native_denoiser(shapes, model_name, dtypes, expert=expert)
    prepared = prepare_native(path, denoiser, name=lora_name, lenient=lenient, where=where)
    report = prepared.report()
    contract = discover_contract(path, lora_name, family=denoiser.family_object, lora=prepared.lora,
                                 strength=strength)
    if contract is not None:
        contract = denoiser.family_object.contracts.on_host(contract)
    text = [accounting_text(report) + f" at strength {strength:g}", *peft_scaling_text(prepared.lora),
            *contract_text(contract)]
    return HostLora(host_deltas(prepared, denoiser), report, contract, text)


def is_peft_folder(lora) -> bool:
    """Whether a read LoRA came from a PEFT adapter folder (its ``adapter_config.json`` is in the metadata)."""
    return isinstance(lora.metadata.get("adapter_config"), dict)


def peft_scaling_text(lora) -> list:
    """The UI line saying which of PEFT's scale rules a PEFT folder uses and the scales they gave its modules
    ([] for a LoRA that is no PEFT folder). Why shown: a wrong scale (alpha/r vs alpha/sqrt(r), a rank or alpha
    pattern that matched nothing) looks like a "weak" or "burnt" LoRA, never like an error, so the node states it."""
    if not is_peft_folder(lora):
        return []
    config = lora.metadata["adapter_config"]
    rule = "alpha/sqrt(r) (rsLoRA)" if config.get("use_rslora") else "alpha/r"
    scales = sorted({round(float(patch.low_rank.scale), 6) for patch in lora.targets.values()
                     if patch.low_rank is not None})
    spread = f"{scales[0]:g}" if len(scales) == 1 else f"{scales[0]:g} to {scales[-1]:g}"
    patterns = [f"{len(config.get(name) or {})} {name} entr{'y' if len(config.get(name) or {}) == 1 else 'ies'}"
                for name in ("rank_pattern", "alpha_pattern")]
    return [f"PEFT scale = {rule}: r={config.get('r', 8)}, lora_alpha={config.get('lora_alpha', 8):g}, "
            f"{', '.join(patterns)}; module scales {spread}"]


# Kinds whose change to a weight is computed from that weight (DoRA renormalises the adapted weight's columns).
BASE_DEPENDENT_KINDS = frozenset({"dora"})


def check_stacking(deltas: dict, patched_keys, lora_name: str, where: str) -> None:
    """Refuse a DoRA LoRA on weights an earlier LoRA node already patches. Our fuse computes every LoRA's change
    from the original weight and adds them up, so the order never matters; ComfyUI's patcher instead hands each
    patch the weight as the patches before it left it (the original is not passed), so a DoRA placed after
    another LoRA would renormalise the already-patched weight and give another result. Placed first, it is exact
    (later LoRAs only add). ``LoraBindError`` naming the file and a key, with what to do."""
    stacked = sorted(key for key, patch in deltas.items() if key in patched_keys
                     and any(getattr(delta, "kind", "") in BASE_DEPENDENT_KINDS for delta in patch.deltas))
    if stacked:
        raise LoraBindError(
            f"{where}: {lora_name} is a DoRA LoRA, and {len(stacked)} of the weights it changes ({stacked[0]}, ...) "
            f"are already patched by an earlier LoRA node. DoRA computes from the original weight, which ComfyUI "
            f"does not pass on to later patches: apply {lora_name} first, then the other LoRAs")


def host_family(shapes: dict, model_name: str) -> str:
    """The model family id of the host denoiser described by ``shapes`` (KeyMatchError when we map none)."""
    return native_denoiser(shapes, model_name).family


def host_patched_value(original, patch, strength: float):
    """The float32 value of one host weight with a LoRA's ``HostPatch`` added (the host's patcher rounds it)."""
    return patch.value(original, strength)


def _expert_index(family_id: str) -> tuple:
    """(the family, an index with every component set, {role: component}) for the expert checks."""
    family = families.family_by_id(family_id)
    index = {component: ["library", "Class"] for component in family.layout.index_roles}
    return family, index, {role: component for component, role in family.layout.component_roles(index).items()}


def host_expert(family_id: str, *, model_part: str = "", model_file: str = "") -> Optional[tuple]:
    """``(PART_HIGH or PART_LOW, how we know)`` of a host MODEL that says which expert it is: the part an earlier
    pair node gave it (``model_part``) or the name of the file it was loaded from (``model_file``, e.g.
    ``wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors``); None when nothing says, or the family has no experts."""
    family, index, roles = _expert_index(family_id)
    if ROLE_HIGH_NOISE not in roles:
        return None
    if model_part in (PART_HIGH, PART_LOW):
        return model_part, f"an earlier LoraBindLoRAPair made it the {model_part}-noise expert"
    if not model_file:
        return None
    try:
        component = family.layout.component_for_file(index, model_file, strict=True)
    except ComponentUnnamedError:  # the file's name does not say which expert
        return None
    part = PART_HIGH if component == roles[ROLE_HIGH_NOISE] else PART_LOW
    return part, f"its file {model_file} says so"


def check_lora_expert(family_id: str, lora_name: str, where: str, input_name: str, expert: tuple) -> None:
    """Refuse a LoRA whose name says the other expert than the host MODEL it goes on (``expert``, from
    ``host_expert``), before the file is read: the pair node refuses a swapped pair by name, and a single node
    given the other expert's file is the same mistake."""
    family, index, roles = _expert_index(family_id)
    part, evidence = expert
    component = roles[ROLE_HIGH_NOISE if part == PART_HIGH else ROLE_LOW_NOISE]
    slots = {roles[ROLE_HIGH_NOISE]: "the high-noise expert MODEL", roles[ROLE_LOW_NOISE]: "the low-noise expert MODEL"}
    try:
        family.layout.check_slots(index, [(component, lora_name, f"{where} {input_name}")], slot_names=slots)
    except KeyMatchError as wrong:
        raise KeyMatchError(f"{wrong} ({where} model is the {part}-noise expert: {evidence})") from None


def check_expert_pair(family_id: str, high_name: str, low_name: str, where: str,
                      model_inputs: tuple = ("model_high", "model_low")) -> None:
    """Refuse a swapped pair by name, as our own pair node does (the family's slot check on a two-expert model),
    in the node's words: each expert is called by the node's model input (``model_inputs``, high then low) and
    each file by its LoRA input, never by the component names our own model path uses."""
    family, index, roles = _expert_index(family_id)
    if ROLE_HIGH_NOISE not in roles:
        return
    high_input, low_input = model_inputs
    family.layout.check_slots(index, [(roles[ROLE_HIGH_NOISE], high_name, f"{where} lora_high"),
                                      (roles[ROLE_LOW_NOISE], low_name, f"{where} lora_low")],
                              slot_names={roles[ROLE_HIGH_NOISE]: high_input, roles[ROLE_LOW_NOISE]: low_input})
