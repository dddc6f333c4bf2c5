"""``map_to_model``: a ``LoraFile`` (file naming) onto one model family's diffusers module paths.

Nothing is dropped here: every tensor of the file ends up in a mapped target, in ``expected_unmatched`` with a
reason, or in ``unmatched`` (diffusers' own converters silently drop ``diff``/``diff_m``/norm keys; we do not).
Whether a mapped module really exists in a given model is checked later by ``accounting.account``.
"""

from __future__ import annotations

from ..errors import KeyMatchError
from .. import families as family_registry  # module import: families imports lora.canonical
from .canonical import LoraFile, MappedLora, TargetPatch
from .layouts import key_role

_LOW_RANK_ROLES = frozenset({"down", "up", "alpha"})
_MODULE_ROLES = _LOW_RANK_ROLES | {"weight", "bias"}
_TEXT_ENCODER_PREFIXES = ("lora_te_", "lora_te1_", "lora_te2_", "lora_te3_", "text_encoder.", "text_encoder_2.")
TEXT_ENCODER_REASON = ("text-encoder LoRA key: lorabind applies LoRAs to the diffusion transformer only, "
                       "the text-encoder part of this file is not used")


def map_to_model(lora: LoraFile, model_family: str) -> MappedLora:
    """Map every target of ``lora`` to the diffusers module path of ``model_family``'s transformer."""
    try:
        family = family_registry.for_model_family(model_family)
    except KeyError:
        raise KeyMatchError(f"{lora.name}: no LoRA key map for model family {model_family!r}") from None
    prepared = family.prepare(lora, model_family)
    mapped = MappedLora(source=prepared, family=model_family, targets={})
    for name, patch in prepared.targets.items():
        module_keys, param_keys = split_source_keys(patch)
        own_diffs = {p: patch.param_diffs[p] for p in ("weight", "bias") if p in patch.param_diffs}
        if patch.low_rank is not None or own_diffs:
            _place(mapped, family, prepared, name, family.map_target(name),
                   TargetPatch(module=name, low_rank=patch.low_rank, param_diffs=own_diffs,
                               source_keys=tuple(module_keys)))
        for param, keys in param_keys.items():
            # another parameter of the module (Wan "modulation"): the family maps the full parameter path
            param_path = family.map_target(f"{name}.{param}")
            dest, _, dest_param = (param_path or "").rpartition(".")
            _place(mapped, family, prepared, f"{name}.{param}", dest if param_path else None,
                   TargetPatch(module=name, param_diffs={dest_param or param: patch.param_diffs[param]},
                               source_keys=tuple(keys)))
    return mapped


def split_source_keys(patch: TargetPatch) -> tuple[list, dict]:
    """Raw keys of a patch: those of the module's own delta/diffs, and {other parameter: keys}.

    A key goes where its role says when that part exists; any other key (a family ``prepare`` may re-home
    tensors, e.g. kijai's ``blocks.N.modulation.diff`` becomes the ``modulation`` diff of ``blocks.N``) goes to
    the module's own part if it has one, else to its first other parameter. No key is ever dropped.
    """
    extra_params = [p for p in patch.param_diffs if p not in ("weight", "bias")]
    has_module_part = patch.low_rank is not None or "weight" in patch.param_diffs or "bias" in patch.param_diffs
    module_keys, param_keys = [], {param: [] for param in extra_params}
    for raw in patch.source_keys:
        role = key_role(raw)
        if (role in _LOW_RANK_ROLES and patch.low_rank is not None) or role in ("weight", "bias") and (
                role in patch.param_diffs):
            module_keys.append(raw)
        elif role in param_keys:
            param_keys[role].append(raw)
        elif extra_params and role not in _MODULE_ROLES:  # e.g. "modulation" renamed by the family map
            param_keys[extra_params[0]].append(raw)
        elif has_module_part or not extra_params:
            module_keys.append(raw)
        else:
            param_keys[extra_params[0]].append(raw)
    return module_keys, param_keys


def _place(mapped: MappedLora, family, lora: LoraFile, name: str, dest, part: TargetPatch) -> None:
    if dest is None:
        reason = family.expected_unmatched_reason(name, mapped.family)
        if reason is None and name.startswith(_TEXT_ENCODER_PREFIXES):
            reason = TEXT_ENCODER_REASON
        if reason is None:
            mapped.unmatched.extend(part.source_keys)
        else:
            mapped.expected_unmatched.update({raw: reason for raw in part.source_keys})
        return
    existing = mapped.targets.get(dest)
    if existing is None:
        mapped.targets[dest] = TargetPatch(module=dest, low_rank=part.low_rank, param_diffs=dict(part.param_diffs),
                                           source_keys=part.source_keys)
        return
    clash = (existing.low_rank is not None and part.low_rank is not None) or (
        set(existing.param_diffs) & set(part.param_diffs))
    if clash:
        raise KeyMatchError(
            f"{lora.name}: keys {existing.source_keys[0]!r} and {part.source_keys[0]!r} both target "
            f"{dest!r} of the {mapped.family} model (the file names one module twice)")
    existing.low_rank = existing.low_rank or part.low_rank
    existing.param_diffs.update(part.param_diffs)
    existing.source_keys = existing.source_keys + part.source_keys
