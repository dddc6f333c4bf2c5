"""What the Wan and Qwen-Image families share: distill LoRAs that declare their step count in the file name, or
their whole contract in their safetensors metadata (``sampling_contract``), which wins over the name."""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from typing import Optional

from ..contract_types import MAX_STEPS, MIN_SHIFT, NO_CONTRACT, ScheduleContract
from ..errors import ContractError
from .sigmas import shifted_sigmas

# safetensors metadata key declaring a Wan/Qwen-Image file's contract: "steps=4, shift=5, cfg=1" (optionally
# "tasks=i2v"; a field the words leave out stays open, so a file never says more than its writer did) or "none"
# (the file has no contract, whatever its name says).
CONTRACT_METADATA_KEY = "sampling_contract"

# "4step", "4steps", "8-steps", "4_step" (not "14steps" read as 4, not "4stepsize")
_STEPS = re.compile(r"(?<![0-9])(\d+)[-_ ]?steps?(?![a-z])", re.IGNORECASE)
_TASK = re.compile(r"[a-z0-9]+")  # a task name of the contract words ("i2v"); several are joined by "|"

# The distill releases (LightX2V, Lightning) sample with flow-matching Euler at their few steps.
DISTILL_SCHEDULER = "euler"


def distill_contract(file_name: str, family: str, shift: float, rank: Optional[int]) -> Optional[ScheduleContract]:
    """N steps on ``shifted_sigmas(N, shift)`` at cfg 1 when ``file_name`` carries a step count N >= 1, else None.
    A count above ``MAX_STEPS`` is no sampling contract (no sampler could run it; a trainer's ``3000steps`` is
    its training length), so it declares nothing rather than a table of that size."""
    steps_match = _STEPS.search(file_name)
    if steps_match is None or not 1 <= int(steps_match[1]) <= MAX_STEPS:
        return None
    return _distill(file_name, family, int(steps_match[1]), shift, 1.0, rank, "file name")


def declared(by_name: Optional[ScheduleContract], file_name: str, metadata: dict, table, family: str,
             rank: Optional[int]) -> Optional[ScheduleContract]:
    """The contract a Wan/Qwen-Image file declares: its metadata's ``sampling_contract``, else a matching user
    contract table entry (``contracts.table.TableEntry`` or None), else what its name says (``by_name``)."""
    if table is not None:
        by_name = _from_table(by_name, file_name, table, family, rank)
    return with_metadata(by_name, file_name, metadata, family, rank)


def open_contract(file_name: str, family: str, rank: Optional[int], open_fields: tuple, note: str, *,
                  shift: Optional[float] = None, cfg: Optional[float] = None) -> ScheduleContract:
    """A distill file whose name carries no step count: what its release pins (often cfg 1, the Qwen-Image
    Lightning shift) and which fields it leaves to the user, said in the contract instead of "none declared"."""
    return ScheduleContract(source=os.path.basename(file_name), kind="distill", family=family, shift=shift,
                            cfg=cfg, rank=rank, declared_by="file name", open_fields=tuple(open_fields), note=note,
                            scheduler=DISTILL_SCHEDULER)


def _from_table(by_name: Optional[ScheduleContract], file_name: str, table, family: str,
                rank: Optional[int]) -> Optional[ScheduleContract]:
    source = os.path.basename(file_name)
    values = _parse_contract_text(table.contract, f"{table.where}: the contract {quoted_words(table.contract)} for "
                                                   f"{source}")
    if values is None:
        if by_name is None:
            return None
        return ScheduleContract(source=by_name.source, kind=NO_CONTRACT, family=family, rank=rank,
                                declared_by=table.where,
                                note=f"'none' in {table.where} overrides the contract its file name suggests "
                                     f"({_summary(by_name)})")
    declared_here = _from_words(file_name, family, values, rank, table.where)
    if by_name is not None and _summary(by_name) != _summary(declared_here):
        declared_here = replace(declared_here, note=f"its file name suggests {_summary(by_name)}; {table.where} "
                                                    f"wins")
    return declared_here


def with_metadata(by_name: Optional[ScheduleContract], file_name: str, metadata: dict, family: str,
                  rank: Optional[int]) -> Optional[ScheduleContract]:
    """The file's contract: its metadata's ``sampling_contract`` when present (it wins over the name, and a name
    that suggests another contract is reported in the contract's note), else ``by_name``."""
    raw = (metadata or {}).get(CONTRACT_METADATA_KEY)
    if raw is None:
        return by_name
    values = _parse_contract_text(str(raw), f"{os.path.basename(file_name)}: safetensors metadata "
                                            f"{CONTRACT_METADATA_KEY}={quoted_words(str(raw))}")
    if values is None:
        if by_name is None:
            return None
        return ScheduleContract(source=by_name.source, kind=NO_CONTRACT, family=family, rank=rank,
                                declared_by="metadata",
                                note=f"{CONTRACT_METADATA_KEY}=none in its metadata overrides the contract "
                                     f"{_suggested_by(by_name)} suggests ({_summary(by_name)})")
    declared = _from_words(file_name, family, values, rank, "metadata")
    if by_name is not None and _summary(by_name) != _summary(declared):
        declared = replace(declared, note=f"{_suggested_by(by_name)} suggests {_summary(by_name)}; the metadata wins")
    return declared


def _distill(file_name: str, family: str, steps: int, shift: Optional[float], cfg: Optional[float],
             rank: Optional[int], declared_by: str, tasks: Optional[tuple] = None) -> ScheduleContract:
    """N steps; the sigma list is pinned only with the shift (an open shift leaves it to the request)."""
    return ScheduleContract(source=os.path.basename(file_name), kind="distill", family=family, steps=steps,
                            sigmas=None if shift is None else shifted_sigmas(steps, shift), shift=shift, cfg=cfg,
                            rank=rank, declared_by=declared_by, scheduler=DISTILL_SCHEDULER, tasks=tasks)


def _from_words(file_name: str, family: str, values: dict, rank: Optional[int], declared_by: str):
    """The contract the words declare, and only that: a field they leave out stays open, never the family's
    default (issue 44: an extracted file whose source left the shift open must not pin one)."""
    return _distill(file_name, family, values["steps"], values.get("shift"), values.get("cfg"), rank, declared_by,
                    values.get("tasks"))


def _summary(contract: ScheduleContract) -> str:
    return " ".join(f"{name}={'open' if value is None else format(value, 'g')}"
                    for name, value in (("steps", contract.steps), ("shift", contract.shift), ("cfg", contract.cfg)))


def _suggested_by(contract: ScheduleContract) -> str:
    """"its file name", or the table line the overridden contract came from."""
    return "its file name" if contract.declared_by == "file name" else contract.declared_by


def _parse_contract_text(raw: str, where: str) -> Optional[dict]:
    """"steps=4, shift=5, cfg=1, tasks=i2v" -> {"steps": 4, "shift": 5.0, "cfg": 1.0, "tasks": ("i2v",)}; "none"
    -> None (a field left out is absent: open). ContractError when
    malformed, starting with ``where`` (the file and key, or the table line): a contract that cannot be read
    must not be silently dropped."""
    if raw.strip().lower() == NO_CONTRACT:
        return None
    values: dict = {}
    try:
        for part in filter(None, (p.strip() for p in raw.split(","))):
            key, equals, value = (x.strip() for x in part.partition("="))
            if not equals or key not in ("steps", "shift", "cfg", "tasks") or key in values:
                raise ValueError(f"unexpected {quoted_words(part)}")
            values[key] = _word_value(key, value)
        if not (1 <= values.get("steps", 0) <= MAX_STEPS and values.get("shift", 1.0) >= MIN_SHIFT
                and values.get("cfg", 1.0) >= 0):
            raise ValueError(f"steps must be 1 to {MAX_STEPS} (what a sampler runs), shift at least {MIN_SHIFT:g} "
                             "and cfg >= 0")
    except ValueError as exc:
        raise ContractError(f"{where} is malformed ({_clipped(str(exc))}); write e.g. 'steps=4, shift=5, cfg=1' or "
                            "'none'") from None
    return values


# What a refusal quotes of the contract words: a file's metadata or a table can hold megabytes of them, and the
# message reaches logs and HTTP answers whole.
_QUOTED_CHARACTERS = 80


def quoted_words(text: str) -> str:
    """``text`` as repr, or its start and its length when longer than ``_QUOTED_CHARACTERS``."""
    if len(text) <= _QUOTED_CHARACTERS:
        return repr(text)
    return f"{text[:_QUOTED_CHARACTERS]!r}... ({len(text)} characters)"


def _clipped(text: str) -> str:
    """A library's error text (``float()`` quotes its whole input) cut to a few quoted lengths."""
    limit = 4 * _QUOTED_CHARACTERS
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _word_value(key: str, value: str):
    """One field of the contract words, typed: steps a whole number, tasks names joined by "|"."""
    if key == "tasks":
        tasks = tuple(value.lower().split("|"))
        if not all(_TASK.fullmatch(task) for task in tasks):
            raise ValueError(f"tasks must be names such as i2v, joined by '|', got {quoted_words(value)}")
        return tasks
    number = int(value) if key == "steps" else float(value)
    if not math.isfinite(number):  # nan and inf would reach the JSON answers and every comparison
        raise ValueError(f"{quoted_words(f'{key}={value}')} is not a finite number")
    return number
