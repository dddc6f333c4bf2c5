"""LoRAs and contracts on a host's own model (ComfyUI's ``MODEL``), for the ComfyUI-native nodes.

Why a use-case module: which denoiser a file's keys fit, the key accounting, the declared contract, the expert
slot check and "is this sampling run what the contract says" are the same rules our own model path applies; a
host model differs only in that the host's patcher writes the weights and the host's sampler runs the steps. So
the nodes hand over what the host model exposes (state-dict names and shapes, the sigmas and cfg a sampler is
about to use) and get back deltas under the host's names, contract records and refusals in our words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..loaders import families
from ..loaders.contracts.schedule_rules import contract_value, describe_artifact, sigma_table  # noqa: F401  (API)
from ..loaders.contracts.sigmas import sigmas_close, slice_offset, switch_step  # noqa: F401  (API)
from ..loaders.dispatch.contract_discovery import contract_to_dict, discover_contract
from ..loaders.errors import ContractError, LoraBindError
from ..loaders.families.roles import ROLE_HIGH_NOISE, ROLE_LOW_NOISE
from ..loaders.models.native_targets import host_deltas, native_denoiser, prepare_native
from .adapters import accounting_text, contract_text

CFG_TOLERANCE = 1e-6
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
                      lenient: bool, where: str, dtypes: Optional[dict] = None) -> HostLora:
    """Read, map and account the LoRA for the host denoiser described by ``shapes`` ({state-dict key: shape}) and
    ``dtypes`` ({state-dict key: dtype name}, what the host stores: patched values are rounded to them as our
    fuse rounds, so the host's own rounding changes nothing)."""
    denoiser = native_denoiser(shapes, model_name, dtypes)
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


def check_expert_pair(family_id: str, high_name: str, low_name: str, where: str,
                      model_inputs: tuple = ("model_high", "model_low")) -> None:
    """Refuse a swapped pair by name, as our own pair node does (the family's slot check on a two-expert model),
    in the node's words: each expert is called by the node's model input (``model_inputs``, high then low) and
    each file by its LoRA input, never by the component names our own model path uses."""
    family = families.family_by_id(family_id)
    index = {component: ["library", "Class"] for component in family.layout.index_roles}
    roles = {role: component for component, role in family.layout.component_roles(index).items()}
    if ROLE_HIGH_NOISE not in roles:
        return
    high_input, low_input = model_inputs
    family.layout.check_slots(index, [(roles[ROLE_HIGH_NOISE], high_name, f"{where} lora_high"),
                                      (roles[ROLE_LOW_NOISE], low_name, f"{where} lora_low")],
                              slot_names={roles[ROLE_HIGH_NOISE]: high_input, roles[ROLE_LOW_NOISE]: low_input})


def expected_part(record: HostContract) -> Optional[tuple]:
    """The sigmas a model carrying ``record`` must sample, None for "any contiguous part of the table"."""
    table = sigma_table(record.contract)
    if table is None or record.part == PART_ANY:
        return None
    if record.part == PART_HIGH:
        return table[: record.switch_step + 1]
    if record.part == PART_LOW:
        return table[record.switch_step:]
    return table


def check_sampling(records: Sequence[HostContract], sigmas: Sequence[float], cfg: Optional[float],
                   host_options: Optional[dict] = None) -> list:
    """Check a host sampler's sigmas and cfg against every enforced contract before its first step: ContractError
    naming the file and the field on a mismatch. ``host_options``: the host model's own sampling options
    (ComfyUI's ``transformer_options``), for what a family's model reads there. Returns the lines for contracts
    that were not enforced."""
    skipped = []
    for record in records:
        problem = _mismatch(record, [float(s) for s in sigmas], cfg, dict(host_options or {}))
        if problem is None:
            continue
        if not record.enforced:
            skipped.append(f"{record.contract.source}: {problem} (not enforced: enforce_contract off)")
            continue
        raise ContractError(f"{describe_artifact(record.contract)}: {problem}. Set the sampler to the contract, or "
                            f"turn enforce_contract off on the LoRA node to override it")
    return skipped


def _family_contracts(contract):
    family = families.family_serving(contract.family) if contract.family else None
    return None if family is None else family.contracts


def _mismatch(record: HostContract, sigmas: list, cfg: Optional[float], host_options: dict) -> Optional[str]:
    contract = record.contract
    if contract.cfg is not None and cfg is not None and abs(float(cfg) - float(contract.cfg)) > CFG_TOLERANCE:
        return f"cfg must be {contract.cfg:g}, the sampler uses cfg {float(cfg):g}"
    family_contracts = _family_contracts(contract)
    problem = _sigma_mismatch(record, sigmas)
    if problem is not None:
        better = family_contracts.explain_host_sigmas(contract, sigmas) if family_contracts else None
        return better or problem
    return family_contracts.host_sampling_problem(contract, sigmas, host_options) if family_contracts else None


def _sigma_mismatch(record: HostContract, sigmas: list) -> Optional[str]:
    contract = record.contract
    table = sigma_table(contract)
    if table is None:
        return None
    wanted = expected_part(record)
    shown = _show(sigmas)
    if wanted is not None:
        if not sigmas_close(sigmas, wanted):
            steps = contract_value(contract, "steps")
            return (f"steps/sigmas: the {record.part}-noise part of its {steps}-step table is {_show(wanted)}, this "
                    f"sampler runs {shown} ({len(sigmas) - 1} step(s) of another schedule)") if record.part != PART_ALL else (
                f"steps/sigmas: it needs {steps} steps on {_show(wanted)}, the sampler runs {len(sigmas) - 1} "
                f"steps on {shown}")
        return None
    if slice_offset(table, sigmas) is None:
        return (f"steps/sigmas: the sampler runs {len(sigmas) - 1} steps on {shown}, which is no part of its "
                f"{contract_value(contract, 'steps')}-step table {_show(table)}")
    return None


def _show(sigmas: Sequence[float]) -> str:
    """A host sampler's sigmas in a message: all of a short list, the ends of a long one (ComfyUI allows 10,000
    steps; a message must not carry them all)."""
    if len(sigmas) <= 8:
        return "[" + ", ".join(f"{s:.4f}" for s in sigmas) + "]"
    ends = ", ".join(f"{s:.4f}" for s in sigmas[:4]) + ", ..., " + ", ".join(f"{s:.4f}" for s in sigmas[-2:])
    return f"[{ends}] ({len(sigmas)} points)"
