"""The one canonical in-memory LoRA representation every file format converts into.

A file is read into ``LoraFile`` (module names still in the file's own naming, layouts already unified);
``map_to_model`` turns it into a ``MappedLora`` whose targets use the diffusers module paths of one model
family. The patcher and the key accounting only ever see ``TargetPatch`` objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .kinds import FullDiff, delta_parts
from .kinds.low_rank import LowRankDelta  # noqa: F401  (re-exported: the plain LoRA kind's delta)


@dataclass
class TargetPatch:
    """Everything one LoRA does to one module: a weight delta of one adapter kind and/or full diffs of its
    parameters. ``low_rank`` holds that kind's delta (``kinds.base.WeightDelta``: a ``LowRankDelta`` for a plain
    LoRA, a LoHa or LoKr delta, ...); it keeps its historic name.

    ``param_diffs`` maps a parameter name of the module to a full delta: ``"weight"`` (``.diff``), ``"bias"``
    (``.diff_b``) or another parameter such as ``"scale_shift_table"`` (Wan ``diff_m`` on ``blocks.N``).

    ``source_keys`` names the file's tensors by the part they give: ``"down"``, ``"up"``, ``"alpha"`` for the
    low-rank delta, and the patched parameter's name for each full diff -> tuple of raw keys. Whoever moves a
    part (a family rewrite, mapping, accounting) moves its keys with it, so no one re-parses key strings to learn
    what a key was for. The part names are open: other adapter kinds may bring their own.
    """

    module: str
    low_rank: Optional["LowRankDelta"] = None
    param_diffs: dict = field(default_factory=dict)
    source_keys: dict = field(default_factory=dict)
    # parameter -> the FullDiff of its ``param_diffs`` tensor, kept so that its bound (a pass over the diff, cached
    # on the FullDiff) is computed once per read of the file, not again on every bind (issue 47)
    _diff_deltas: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def parameter_deltas(self) -> dict:
        """{parameter name: (WeightDelta, ...)}: every change this patch makes, each as a kind's delta (the weight
        delta first, then a full diff of the same parameter); what the patcher fuses and accounting counts."""
        deltas: dict = {}
        if self.low_rank is not None:
            deltas["weight"] = (self.low_rank,)
        for param, diff in self.param_diffs.items():
            delta = self._diff_deltas.get(param)
            if delta is None or delta.tensor is not diff:  # param_diffs may be rewritten (mapping, accounting)
                delta = self._diff_deltas[param] = FullDiff(diff)
            deltas[param] = deltas.get(param, ()) + (delta,)
        return deltas

    def all_source_keys(self) -> tuple:
        """Every raw key of this patch, part by part."""
        return tuple(key for keys in self.source_keys.values() for key in keys)


def low_rank_parts() -> frozenset:
    """The ``source_keys`` parts of ``TargetPatch.low_rank``, over every registered adapter kind."""
    return delta_parts()


def merged_keys(first: dict, second: dict) -> dict:
    """Two ``source_keys`` dicts as one (keys of a shared part concatenated)."""
    merged = dict(first)
    for part, keys in second.items():
        merged[part] = tuple(merged.get(part, ())) + tuple(keys)
    return merged


@dataclass
class LoraFile:
    """A LoRA file or PEFT folder after reading and layout normalisation (names still as in the file)."""

    path: str
    name: str  # file/folder name, used in every message
    format: str  # e.g. "lightx2v-native", "kohya", "diffusers", "peft-folder", "minimax-h3-native"
    metadata: dict
    targets: dict  # module name in file naming -> TargetPatch
    dtype: str = ""
    identity: tuple = ()  # ``io.file_identity`` of the file(s), for caches


@dataclass
class MappedLora:
    """A ``LoraFile`` mapped onto one model family's diffusers module paths."""

    source: LoraFile
    family: str  # the model family id mapped onto ("wan2.2_moe")
    targets: dict  # diffusers module path -> TargetPatch
    expected_unmatched: dict = field(default_factory=dict)  # raw key -> reason
    unmatched: list = field(default_factory=list)  # raw keys the family map does not know
    keymap: Any = None  # the family's ``KeyMap`` that mapped it (``account`` asks it why a key is expected to miss)
