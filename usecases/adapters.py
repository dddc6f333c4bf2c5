"""Attaching LoRAs to a model handle: the fuse, the expert pair and the dynamic adapter, validated up front.

Why a use-case layer: the rules (which denoiser a file goes to, the slot check, the key accounting, the declared
contract, what the UI shows of it) are the same for the ComfyUI nodes, the CLI and the server, and none of them
is a node's business. Nothing here touches a weight: each verb returns a NEW handle describing the wanted state;
the sampler binds it right before denoising.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ..loaders import families
from ..loaders.binding.peft_adapters import to_peft_groups
from ..loaders.binding.strength_schedules import parse_strength_schedule
from ..loaders.dispatch.contract_discovery import contract_to_dict, discover_contract
from ..loaders.errors import LoraBindError
from ..loaders.families.roles import ROLE_HIGH_NOISE, ROLE_LOW_NOISE
from ..loaders.handles import AdapterHandle, AdapterSpec, FuseSpec
from ..loaders.lora import read_lora
from ..loaders.lora.preparation import prepare_lora


@dataclass
class Attached:
    """What an attach verb gives a host: the new handle and what to show (accounting reports, contract views,
    text lines)."""

    handle: object
    accounting: list = field(default_factory=list)
    contracts: list = field(default_factory=list)
    text: list = field(default_factory=list)


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


def component_for(model_handle, lora_name: str, component: Optional[str], where: str) -> str:
    """The denoiser a file goes to: ``component`` when named, else the one the model's family says (Wan2.2 MoE:
    the expert the file name says; a name that says none is refused, naming ``where``)."""
    if component:
        return component
    loaded = model_handle.model
    try:
        return families.family_for(loaded).layout.component_for_file(loaded.model_index, lora_name)
    except LoraBindError as exc:
        raise type(exc)(f"{where}: {exc} (model {loaded.name})") from None


def schedule_text(schedule) -> list:
    """The UI line of a strength schedule ([] when there is none)."""
    return [] if schedule is None else [f"strength per step: × [{schedule.describe()[:200]}]"]


def prepare_fuse(model_handle, name: str, path: str, strength: float, component: str, where: str,
                 lenient: bool = False, strength_schedule: str = ""):
    """One validated fuse: (FuseSpec, accounting report, declared contract or None, UI text lines). The family
    refuses a file made for another model kind or slot first (``check_artifact``), before any key is read."""
    schedule = parse_strength_schedule(strength_schedule, where)
    _check_not_fused_yet(model_handle, name, path, strength, component, where)
    family = families.family_for(model_handle.model)
    family.contracts.check_artifact(model_handle.model, os.path.basename(name), component)
    prepared = prepare_lora(path, model_handle.model, component, family, guess_family=families.guess_family,
                            name=name, lenient=lenient, where=where)
    report = prepared.report()
    contract = discover_contract(path, name, family=family, lora=prepared.lora, strength=strength)
    spec = FuseSpec(path=path, strength=float(strength), component=component, name=name, lenient=bool(lenient),
                    strength_schedule=schedule)
    return spec, report, contract, [accounting_text(report) + f" at strength {strength:g}", *schedule_text(schedule),
                                    *contract_text(contract)]


def _check_not_fused_yet(model_handle, name: str, path: str, strength: float, component: str, where: str) -> None:
    """Refuse a file the handle already fuses into the same component: the two fuses would add up (strength a +
    b) on the same weights, which no one means (the guide's distill command fused Lightning twice, silently).
    The same file into the other expert of a pair is a different binding and allowed."""
    for fused in model_handle.fuses:
        if fused.component == component and _same_file(fused.path, path):
            raise LoraBindError(
                f"{where}: {name} is fused into {component} of {model_handle.model.name} already (as "
                f"{fused.name or os.path.basename(fused.path)} at strength {fused.strength:g}); a second fuse of the "
                f"same file would add to it (strength {fused.strength:g} + {float(strength):g}). Remove one of them, "
                "or give the one fuse the strength you want")


def _same_file(first: str, second: str) -> bool:
    """One file under two names (links resolved, hard links included); False when either cannot be read."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return os.path.realpath(first) == os.path.realpath(second)


def attach_fuse(model_handle, name: str, path: str, strength: float, component: Optional[str] = None, *,
                where: str, lenient: bool = False, strength_schedule: str = "") -> Attached:
    """Record one fuse (and its contract) on a new handle; ``component`` None: the family decides."""
    component = component_for(model_handle, name, component, where)
    spec, report, contract, text = prepare_fuse(model_handle, name, path, strength, component, where, lenient,
                                                strength_schedule)
    handle = model_handle.with_fuses(spec, contracts=(contract,) if contract else ())
    return Attached(handle, [report], [contract_to_dict(contract)], text)


def attach_fuses(model_handle, slots: list, *, where: str, lenient: bool = False,
                 strength_schedule: str = "") -> Attached:
    """Several fuses at once, each into a named slot: ``slots`` are ``(input name, lora name or None, path,
    strength, component)``. The family checks every file against its slot first, naming all misplaced ones.
    ``strength_schedule`` multiplies every slot's strength alike (a pair fades together)."""
    loaded = model_handle.model
    families.family_for(loaded).layout.check_slots(
        loaded.model_index, [(component, name, input_name) for input_name, name, _, _, component in slots if name])
    specs, contracts, attached = [], [], Attached(model_handle)
    for input_name, name, path, strength, component in slots:
        if not name:
            attached.text.append(f"{input_name}: none")
            continue
        spec, report, contract, lines = prepare_fuse(model_handle, name, path, strength, component, where, lenient,
                                                     strength_schedule)
        specs.append(spec)
        attached.accounting.append(report)
        attached.contracts.append(contract_to_dict(contract))
        attached.text += lines
        contracts += [contract] if contract is not None else []
    if specs:
        attached.handle = model_handle.with_fuses(*specs, contracts=tuple(contracts))
    return attached


def expert_slots(model_handle) -> tuple:
    """(high-noise expert, low-noise expert) component names of a two-expert model; None when it has no pair."""
    loaded = model_handle.model
    if not families.has_expert_pair(loaded):
        return None
    roles = families.family_for(loaded).layout.denoiser_roles(loaded)
    by_role = {role: name for name, role in roles.items()}
    return by_role[ROLE_HIGH_NOISE], by_role[ROLE_LOW_NOISE]


def attach_adapter(lora_name: str, path: str, scale: float, component: str,
                   adapter: Optional[AdapterHandle] = None, lenient: bool = False,
                   strength_schedule: str = "", where: str = "LoadPEFTAdapter") -> Attached:
    """A dynamic (PEFT) adapter stacked on ``adapter``. The file is read and converted to peft's form now, so one
    that cannot be dynamic (full diffs, convolutions) is refused here, naming it, not at sampling time."""
    schedule = parse_strength_schedule(strength_schedule, where)
    lf = read_lora(path)  # the engine's cached reader: bind() finds the file there later
    to_peft_groups(lf.targets, lora_name)
    contract = discover_contract(path, lora_name, lora=lf, strength=scale)
    spec = AdapterSpec(path=path, scale=float(scale), component=component, name=lora_name, lenient=bool(lenient),
                       strength_schedule=schedule)
    handle = (adapter or AdapterHandle()).stacked(spec, (contract,) if contract else ())
    text = [f"{lora_name} ({lf.format}) at scale {scale:g} on {component}", *schedule_text(schedule),
            *contract_text(contract)]
    return Attached(handle, [], [contract_to_dict(contract)], text)
