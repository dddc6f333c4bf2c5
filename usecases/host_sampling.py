"""Is this host sampler run what the LoRA contracts on its model say? The check a ComfyUI sampler run gets.

Why a use-case module of its own: the host (ComfyUI) decides everything about a sampler run: its sigmas, its step
rule, the guider and whatever it applies between the model's predictions (``cfg``, a second scale, a per-step
override, a rescaling hook). The node layer reads what the host is about to apply into a ``HostRun`` (and, at
each step, a ``HostGuidance``); here those readings are held against every enforced contract, with the same
words whatever the host. A reading the node layer could not make (a guider class it does not know) is a refusal
by name, never a pass: a contract that is "enforced" must not be trusted to a guider we cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..loaders import families
from ..loaders.contracts.schedule_rules import contract_value, describe_artifact, sigma_table
from ..loaders.contracts.sigmas import sigmas_close, slice_offset
from ..loaders.errors import ContractError
from .host_models import PART_ALL, PART_ANY, PART_HIGH, PART_LOW, HostContract

CFG_TOLERANCE = 1e-6
_OFF = "turn enforce_contract off on the LoRA node to override it"


@dataclass(frozen=True)
class HostGuidance:
    """What a host's guidance applies to the model's predictions at one step.

    ``guider``: the guider as its user knows it (``CFGGuider``, ``DualCFGGuider``...); ``scales``: its own scales
    as ``(input name, value)``; ``cfg``: the one classifier-free guidance scale they amount to (None when they
    amount to none: two scales, or a perpendicular negative); ``unreadable``: the guider is a class we cannot read;
    ``hooks``: the model-option functions that change the guided prediction (a CFG function, pre/post-CFG
    functions), by name."""

    guider: str
    scales: tuple = ()
    cfg: Optional[float] = None
    unreadable: bool = False
    hooks: tuple = ()

    def applied(self) -> str:
        """The guidance in words: "cfg 3.5", "cfg_conds 3.5, cfg_cond2_negative 1 (DualCFGGuider)"."""
        shown = ", ".join(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"
                          for name, value in self.scales) or f"cfg {self.cfg:g}"
        return shown if [name for name, _ in self.scales] == ["cfg"] else f"{shown} ({self.guider})"


def plain_cfg(cfg: float, guider: str = "CFGGuider") -> HostGuidance:
    """Plain classifier-free guidance at ``cfg`` (KSampler, KSamplerAdvanced, CFGGuider)."""
    return HostGuidance(guider, (("cfg", float(cfg)),), float(cfg))


@dataclass(frozen=True)
class HostRun:
    """A host sampler run before its first step: the sigmas it steps, its guidance (None when it is known only
    step by step: ``check_step``), its step rule (``sampler``: "euler", "dpmpp_2m", ...; None when the host did not
    say), its model's own options (ComfyUI's ``transformer_options``) and the keys its positive conditioning carries
    (what the task is)."""

    sigmas: tuple
    guidance: Optional[HostGuidance]
    sampler: Optional[str] = None
    options: dict = field(default_factory=dict)
    condition_keys: frozenset = frozenset()


def check_sampling(records: Sequence[HostContract], run: HostRun) -> list:
    """Check a host sampler run against every enforced contract before its first step: ContractError naming the
    file and the field on a mismatch. Returns the lines for the contracts that were not enforced (the override,
    recorded)."""
    sigmas = [float(s) for s in run.sigmas]
    return _checked(records, lambda record: _guidance_problem(record, run.guidance)
                    or _sampler_problem(record, run.sampler) or _schedule_problem(record, sigmas, run))


def check_step(records: Sequence[HostContract], guidance: HostGuidance, sigma: Optional[float] = None) -> list:
    """The guidance of the step from ``sigma`` (a per-step override such as CFGOverride changes it after the run's
    check): ContractError on an enforced mismatch, the override lines otherwise."""
    at = "" if sigma is None else f" at the step from sigma {sigma:.4f}"
    return _checked(records, lambda record: _guidance_problem(record, guidance), at)


def _checked(records, problem_of, refusal_detail: str = "") -> list:
    """Raise on the first enforced problem (with ``refusal_detail``, e.g. the step); the override lines of the
    others (without it: one line per override, whichever step meets it)."""
    skipped = []
    for record in records:
        problem = problem_of(record)
        if problem is None:
            continue
        if not record.enforced:
            skipped.append(f"{record.contract.source}: {problem} (not enforced: enforce_contract off)")
            continue
        raise ContractError(f"{describe_artifact(record.contract)}: {problem}{refusal_detail}. Set the sampler to the "
                            f"contract, or {_OFF}")
    return skipped


def _guidance_problem(record: HostContract, guidance: Optional[HostGuidance]) -> Optional[str]:
    wanted = record.contract.cfg
    if wanted is None or guidance is None:
        return None
    if guidance.unreadable:
        return (f"cfg must be {wanted:g}, and the sampler's guider {guidance.guider} is one lorabind cannot read, so "
                f"the cfg it applies is unknown (use KSampler, KSamplerAdvanced, CFGGuider, BasicGuider, "
                f"DualCFGGuider or PerpNegGuider)")
    if guidance.hooks:
        return (f"cfg must be {wanted:g}, and the model carries {', '.join(guidance.hooks)}, which change the guided "
                f"prediction in a way lorabind cannot check (remove the node that adds it)")
    if guidance.cfg is None or abs(guidance.cfg - float(wanted)) > CFG_TOLERANCE:
        return f"cfg must be {wanted:g}, the sampler uses {guidance.applied()}"
    return None


def _sampler_problem(record: HostContract, sampler: Optional[str]) -> Optional[str]:
    """The step rule: a contract that pins one (the distill LoRAs: euler, as published) refuses another."""
    pinned = getattr(record.contract, "scheduler", None)
    if not pinned or sampler is None or sampler == pinned:
        return None
    return f"sampler: it is sampled with {pinned} by its publisher, the sampler runs {sampler} (set sampler_name " \
           f"to {pinned})"


def _family_contracts(contract):
    family = families.family_serving(contract.family) if contract.family else None
    return None if family is None else family.contracts


def _schedule_problem(record: HostContract, sigmas: list, run: HostRun) -> Optional[str]:
    contract = record.contract
    family_contracts = _family_contracts(contract)
    problem = _sigma_mismatch(record, sigmas)
    if problem is not None:
        better = family_contracts.explain_host_sigmas(contract, sigmas) if family_contracts else None
        return better or problem
    if family_contracts is None:
        return None
    return family_contracts.host_sampling_problem(contract, sigmas, dict(run.options), run.condition_keys)


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


def _sigma_mismatch(record: HostContract, sigmas: list) -> Optional[str]:
    contract = record.contract
    table = sigma_table(contract)
    if table is None:
        return None
    wanted = expected_part(record)
    shown = show_sigmas(sigmas)
    steps = contract_value(contract, "steps")
    if wanted is not None:
        if sigmas_close(sigmas, wanted):
            return None
        if record.part != PART_ALL:
            return (f"steps/sigmas: the {record.part}-noise part of its {steps}-step table is {show_sigmas(wanted)}, "
                    f"this sampler runs {shown} ({len(sigmas) - 1} step(s) of another schedule)")
        return (f"steps/sigmas: it needs {steps} steps on {show_sigmas(wanted)}, the sampler runs {len(sigmas) - 1} "
                f"steps on {shown}")
    if slice_offset(table, sigmas) is None:
        return (f"steps/sigmas: the sampler runs {len(sigmas) - 1} steps on {shown}, which is no part of its "
                f"{steps}-step table {show_sigmas(table)}")
    return None


def show_sigmas(sigmas: Sequence[float]) -> str:
    """A host sampler's sigmas in a message: all of a short list, the ends of a long one (ComfyUI allows 10,000
    steps; a message must not carry them all)."""
    if len(sigmas) <= 8:
        return "[" + ", ".join(f"{s:.4f}" for s in sigmas) + "]"
    ends = ", ".join(f"{s:.4f}" for s in sigmas[:4]) + ", ..., " + ", ".join(f"{s:.4f}" for s in sigmas[-2:])
    return f"[{ends}] ({len(sigmas)} points)"
