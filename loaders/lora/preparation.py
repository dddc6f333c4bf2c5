"""``prepare_lora``: THE way a LoRA file becomes validated targets for one denoiser component.

Read (cached) -> map onto the model family's module paths -> account every tensor against the component's real
module tree. Binding, the adapter nodes, ``lorabind inspect`` and ``lorabind merge`` all call this one function,
so a file is refused with the same words wherever it is used, and what ``inspect`` reports is exactly what a fuse
would apply. Also here: the small questions every caller asks about a LoRA file (its rank, its adapter kinds).
The contract it declares is ``dispatch.contract_discovery.discover_contract``'s answer; which denoiser a file's name says it
belongs in is its model family's (``FamilyLayout.component_for_file``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import KeyMatchError
from . import kinds
from .accounting import KeyAccounting, account
from .canonical import LoraFile
from .mapping import map_to_model
from .reader import read_lora


@dataclass(frozen=True)
class PreparedLora:
    """One LoRA validated against one component: what the patcher consumes plus what reports show."""

    name: str  # the label used in every message (a loras-root name, or the file/folder name)
    path: str
    component: str
    lora: LoraFile  # the file as read (file naming), e.g. for its metadata and rank
    accounting: KeyAccounting  # every tensor counted; ``accounting.applied`` are the targets that fit

    @property
    def targets(self) -> dict:
        """diffusers module path -> TargetPatch, only the parts that fit the component."""
        return self.accounting.applied

    @property
    def rank(self) -> Optional[int]:
        return lora_rank(self.lora)

    def report(self) -> dict:
        """The JSON-able accounting report nodes and commands show, labelled with the LoRA's name."""
        return {"lora": self.name, **self.accounting.to_dict()}


def prepare_lora(path: str, model, component: str, family, *, guess_family: Optional[Callable] = None,
                 name: str = "", lenient: bool = False, where: str = "") -> PreparedLora:
    """Read, map and account the LoRA at ``path`` for ``component`` of ``model`` (anything with ``family``,
    ``components`` and ``name``: a LoadedModel, or the meta-device structure ``merge`` builds). ``family`` is the
    model's ``ModelFamily`` and ``guess_family`` the registry's guess (``families.family_for`` /
    ``families.guess_family``): the caller passes them because the registry imports the key maps, which import
    this package.

    Raises ``LoraFileError`` (unreadable file), ``KeyMatchError`` (no such component, keys that fit nothing
    unless ``lenient``, shapes that do not fit) with messages naming the file; ``where`` (a node name, a command)
    prefixes the missing-component message and is the one whose ``lenient`` a refusal offers. Nothing is patched.
    """
    label = name or os.path.basename(str(path).rstrip("/\\"))
    module = model.components.get(component)
    if module is None:
        prefix = f"{where}: " if where else ""
        raise KeyMatchError(
            f"{prefix}{label} is meant for component '{component}', which model {model.name} ({model.family}) "
            f"does not have (components: {', '.join(sorted(model.components)) or 'none'})")
    lora = read_lora(path)
    accounting = account(map_to_model(lora, model.family, family), module, lenient=lenient, component=component,
                         guess_family=guess_family, caller=where)
    return PreparedLora(name=label, path=str(path), component=component, lora=lora, accounting=accounting)


def lora_rank(lora: LoraFile) -> Optional[int]:
    """The rank shared by every low-rank pair of the file, None when there is none or they differ."""
    ranks = {patch.low_rank.rank for patch in lora.targets.values() if patch.low_rank is not None}
    return ranks.pop() if len(ranks) == 1 else None


def kind_summary(targets: dict) -> dict:
    """What each adapter kind of a file does, as the kinds name themselves (``inspect``): ``{kind: {"modules",
    "tensors", "ranks", "alphas"}}`` (plus ``"on"`` for a wrapping kind such as DoRA: the kinds it decomposes).
    A module's weight-delta tensors (factors, alpha, magnitude) count for its kind; full diffs for ``diff``; a
    tensor shared by several modules counts once.
    ``ranks``/``alphas`` are the distinct values (an alpha of None: the module's file has none)."""
    summary: dict = {}
    weight_parts = kinds.delta_parts()

    def entry(name):
        return summary.setdefault(name, {"modules": 0, "tensors": set(), "ranks": set(), "alphas": set()})

    for patch in targets.values():
        delta = patch.low_rank
        if delta is not None:
            item = entry(delta.kind)
            item["modules"] += 1
            item["tensors"].update(key for part, keys in patch.source_keys.items() if part in weight_parts
                                   for key in keys)
            item["ranks"].add(delta.rank)
            item["alphas"].add(delta.alpha)
            inner = getattr(delta, "inner_kind", None)
            if inner is not None:
                item.setdefault("on", set()).add(inner)
        diffs = {key for part, keys in patch.source_keys.items() if part not in weight_parts for key in keys}
        if diffs:
            item = entry("diff")
            item["modules"] += 1
            item["tensors"].update(diffs)
            item["ranks"].add(0)
            item["alphas"].add(None)
    for item in summary.values():
        # the file's tensors, each once: a fused tensor split over several modules (MiniMax-H3's grouped qkv
        # -> q, k, v) is one tensor of the file, as the "in all" count says
        item["tensors"] = len(item["tensors"])
        item["ranks"] = sorted(item["ranks"])
        item["alphas"] = sorted(a for a in item["alphas"] if a is not None) + ([None] if None in item["alphas"] else [])
        if "on" in item:
            item["on"] = sorted(item["on"])
    return summary
