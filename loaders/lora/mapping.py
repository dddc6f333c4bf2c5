"""``map_to_model``: a ``LoraFile`` (file naming) onto one model family's diffusers module paths.

Nothing is dropped here: every tensor of the file ends up in a mapped target, in ``expected_unmatched`` with a
reason, or in ``unmatched`` (diffusers' own converters silently drop ``diff``/``diff_m``/norm keys; we do not).
Whether a mapped module really exists in a given model is checked later by ``accounting.account``.

The family object is passed in, never looked up here: the family registry imports the families' key maps, which
import this package, so asking the registry from ``lora/`` would close a circle.
"""

from __future__ import annotations

from ..errors import KeyMatchError
from .canonical import LoraFile, MappedLora, TargetPatch, low_rank_parts, merged_keys

_OWN_PARAMETERS = ("weight", "bias")  # a module's own parameters; any other diff targets another parameter
_TEXT_ENCODER_PREFIXES = ("lora_te_", "lora_te1_", "lora_te2_", "lora_te3_", "text_encoder.", "text_encoder_2.")
TEXT_ENCODER_REASON = ("text-encoder LoRA key: lorabind applies LoRAs to the diffusion transformer only, "
                       "the text-encoder part of this file is not used")


def map_to_model(lora: LoraFile, model_family: str, family) -> MappedLora:
    """Map every target of ``lora`` to the diffusers module paths of ``model_family``'s denoiser, by the key map
    of ``family`` (the ``ModelFamily`` serving ``model_family``; ``families.family_by_id``)."""
    keymap = family.keymap
    prepared = keymap.prepare(lora, model_family)
    mapped = MappedLora(source=prepared, family=model_family, targets={}, keymap=keymap)
    module_parts = low_rank_parts() | frozenset(_OWN_PARAMETERS)
    for name, patch in prepared.targets.items():
        own_diffs = {p: patch.param_diffs[p] for p in _OWN_PARAMETERS if p in patch.param_diffs}
        if patch.low_rank is not None or own_diffs:
            own_keys = {part: keys for part, keys in patch.source_keys.items() if part in module_parts}
            _place(mapped, keymap, prepared, name, keymap.map_target(name),
                   TargetPatch(module=name, low_rank=patch.low_rank, param_diffs=own_diffs, source_keys=own_keys))
        for param, diff in patch.param_diffs.items():
            if param in _OWN_PARAMETERS:
                continue
            # another parameter of the module (Wan "modulation"): the family maps the full parameter path
            param_path = keymap.map_target(f"{name}.{param}")
            dest, _, dest_param = (param_path or "").rpartition(".")
            dest_param = dest_param or param
            _place(mapped, keymap, prepared, f"{name}.{param}", dest if param_path else None,
                   TargetPatch(module=name, param_diffs={dest_param: diff},
                               source_keys={dest_param: tuple(patch.source_keys.get(param, ()))}))
        # a part that names no data of this patch cannot be applied; it is reported, never dropped
        mapped.unmatched.extend(key for part, keys in patch.source_keys.items()
                                if part not in module_parts and part not in patch.param_diffs for key in keys)
    return mapped


def _place(mapped: MappedLora, keymap, lora: LoraFile, name: str, dest, part: TargetPatch) -> None:
    if dest is None:
        reason = keymap.expected_unmatched_reason(name, mapped.family)
        if reason is None and name.startswith(_TEXT_ENCODER_PREFIXES):
            reason = TEXT_ENCODER_REASON
        if reason is None:
            mapped.unmatched.extend(part.all_source_keys())
        else:
            mapped.expected_unmatched.update({raw: reason for raw in part.all_source_keys()})
        return
    existing = mapped.targets.get(dest)
    if existing is None:
        mapped.targets[dest] = TargetPatch(module=dest, low_rank=part.low_rank, param_diffs=dict(part.param_diffs),
                                           source_keys=dict(part.source_keys))
        return
    clash = (existing.low_rank is not None and part.low_rank is not None) or (
        set(existing.param_diffs) & set(part.param_diffs))
    if clash:
        raise KeyMatchError(
            f"{lora.name}: keys {existing.all_source_keys()[0]!r} and {part.all_source_keys()[0]!r} both target "
            f"{dest!r} of the {mapped.family} model (the file names one module twice)")
    existing.low_rank = existing.low_rank or part.low_rank
    existing.param_diffs.update(part.param_diffs)
    existing.source_keys = merged_keys(existing.source_keys, part.source_keys)
