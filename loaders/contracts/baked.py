"""Contracts that travel with a model folder into which ``lorabind merge`` baked distill LoRAs.

Why: a folder with a 4-step distill pair fused in must still be sampled with 4 steps, exactly like the unmerged
pair. ``merge`` writes the fused LoRAs' contracts, and what was fused (file names, strengths, content hashes —
no local paths), under ``_lorabind`` in the output ``model_index.json``, the way MiniMax-H3 pinned checkpoints
carry ``_minimax_h3.base_schedule``; the model loader turns them back into contracts on the model handle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from ..contract_types import ScheduleContract
from ..errors import ContractError
from .distill_names import CONTRACT_METADATA_KEY

INDEX_KEY = "_lorabind"
_TUPLE_FIELDS = {f.name for f in dataclasses.fields(ScheduleContract)
                 if "tuple" in str(f.type) and f.name != "extra"}


def contract_to_json(contract: ScheduleContract) -> dict:
    data = dataclasses.asdict(contract)
    data["extra"] = [list(pair) for pair in contract.extra]
    return {key: list(value) if isinstance(value, tuple) else value for key, value in data.items()}


def contract_from_json(data: dict, model_name: str) -> ScheduleContract:
    """A baked contract, its source reading "<model> (baked in from <file>)" so errors name both."""
    known = {f.name for f in dataclasses.fields(ScheduleContract)}
    fields = {key: value for key, value in data.items() if key in known}
    for key in _TUPLE_FIELDS & set(fields):
        if fields[key] is not None:
            fields[key] = tuple(fields[key])
    fields["extra"] = tuple(tuple(pair) for pair in fields.get("extra") or ())
    fields["source"] = f"{model_name} (baked in from {data.get('source', 'a merged LoRA')})"
    return ScheduleContract(**fields)


def baked_contracts(model_index: dict, model_name: str) -> tuple:
    """The contracts a merged folder carries, as a tuple (empty for any other folder)."""
    baked = model_index.get(INDEX_KEY)
    if not isinstance(baked, dict):
        return ()
    return tuple(contract_from_json(entry, model_name) for entry in baked.get("contracts") or ()
                 if isinstance(entry, dict))


def file_sha256(path: str) -> str:
    """Content hash of a LoRA file (or of every file of a PEFT folder, in name order)."""
    digest = hashlib.sha256()
    files = ([os.path.join(path, n) for n in sorted(os.listdir(path))] if os.path.isdir(path) else [path])
    for name in files:
        if os.path.isfile(name):
            with open(name, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def extracted_contract_metadata(model_index: dict, component: str | None) -> dict:
    """The ``sampling_contract`` metadata a LoRA ``extract``ed from ``component`` of a merged folder carries: the
    contract baked in with the LoRAs fused into that component, so the extracted file still runs only as the
    files it came from did (issue 28: the extract used to drop it). ``component`` None: every fuse counts (a
    merged single file is one component; pass its ``_lorabind`` record as ``{INDEX_KEY: record}``). {} when
    nothing baked into it declares a step count. Two fuses into one component declaring different contracts are
    refused: no one file can say both."""
    baked = model_index.get(INDEX_KEY)
    if not isinstance(baked, dict):
        return {}
    fused_here = {os.path.basename(str(entry.get("name", ""))) for entry in baked.get("fused") or ()
                  if isinstance(entry, dict) and component in (None, entry.get("component"))}
    texts = {_metadata_text(entry) for entry in baked.get("contracts") or ()
             if isinstance(entry, dict) and entry.get("source") in fused_here and entry.get("steps")}
    if len(texts) > 1:
        raise ContractError(f"the LoRAs baked into {component} declare different contracts ({sorted(texts)}); an "
                            f"extracted file can carry only one")
    return {CONTRACT_METADATA_KEY: texts.pop()} if texts else {}


def _metadata_text(entry: dict) -> str:
    """"steps=4, shift=5, cfg=1" (", tasks=i2v" when it serves named tasks); a field the contract leaves open is
    left out, and the reader keeps it open, so the extracted file is never stricter than the fused one."""
    parts = [f"steps={int(entry['steps'])}"]
    parts += [f"{name}={float(entry[name]):g}" for name in ("shift", "cfg") if entry.get(name) is not None]
    if entry.get("tasks"):
        parts.append("tasks=" + "|".join(str(task) for task in entry["tasks"]))
    return ", ".join(parts)
