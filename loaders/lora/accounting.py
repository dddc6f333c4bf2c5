"""Key accounting: check a ``MappedLora`` against a real module tree before anything is patched.

Every tensor of the file is counted exactly once as *applied*, *expected unmatched* (with a reason, e.g. the
Wan2.1 I2V image branch on a model without one) or *unmatched*. Shape mismatches always raise; unmatched keys
raise unless ``lenient``. The patcher consumes ``KeyAccounting.applied`` only, so it never sees a target that
does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..errors import KeyMatchError
from ..gguf_weights import logical_shape
from .canonical import MappedLora, TargetPatch, low_rank_parts, merged_keys

_SHOWN_KEYS = 8  # how many keys an error/warning lists before "... and N more"


@dataclass
class KeyAccounting:
    file: str
    format: str
    family: str
    component: str
    applied: dict = field(default_factory=dict)  # module path -> TargetPatch (only the parts that fit)
    expected_unmatched: dict = field(default_factory=dict)  # raw key -> reason
    unmatched: list = field(default_factory=list)  # raw keys
    counts: dict = field(default_factory=dict)  # {"applied", "expected_unmatched", "unmatched"} in tensors
    rank: Optional[int] = None  # None when mixed (see ranks) or no low-rank pair
    ranks: set = field(default_factory=set)
    alpha: Optional[float] = None  # None when absent or mixed
    scale: Optional[float] = None  # None when mixed
    dtype: str = ""
    warnings: list = field(default_factory=list)
    refusal: str = ""  # why a strict fuse refuses this file (unmatched keys); "" when every key is accounted for

    def to_dict(self) -> dict:
        """JSON-able report for nodes and the CLI."""
        return {
            "file": self.file, "format": self.format, "family": self.family, "component": self.component,
            "counts": dict(self.counts), "modules": len(self.applied),
            # model parameters the applied tensors change (a low-rank pair changes one weight; a full diff one
            # weight/bias/modulation): what a fuse writes, as opposed to counts["applied"], the file's tensors
            "parameters": sum(len(p.parameter_deltas()) for p in self.applied.values()),
            "rank": self.rank,
            "ranks": sorted(self.ranks), "alpha": self.alpha, "scale": self.scale, "dtype": self.dtype,
            "expected_unmatched": dict(self.expected_unmatched), "unmatched": list(self.unmatched),
            "warnings": list(self.warnings),
        }


def account(mapped: MappedLora, component_module, *, lenient: bool = False, component: str = "denoiser",
            guess_family: Optional[Callable] = None, caller: str = "") -> KeyAccounting:
    """Check every target of ``mapped`` against ``component_module`` (the denoiser's module tree). Unmatched keys
    raise ``KeyMatchError`` unless ``lenient``; either way ``refusal`` holds that message, naming the family the
    file looks like when ``guess_family`` (``families.guess_family``, passed in: lora/ never imports it) says, and
    the way out in ``caller``'s words (a node or command name; "" names every one)."""
    lora = mapped.source
    keymap = mapped.keymap
    file_names = _file_names_by_key(mapped)
    modules = dict(component_module.named_modules())
    acc = KeyAccounting(file=lora.name, format=lora.format, family=mapped.family, component=component,
                        expected_unmatched=dict(mapped.expected_unmatched), unmatched=list(mapped.unmatched),
                        dtype=lora.dtype)
    where = f"{component} ({mapped.family})"

    for dest, patch in mapped.targets.items():
        dest, patch = _as_parameter_diff(modules, dest, patch)
        module = modules.get(dest)
        if module is None:
            _not_in_model(acc, keymap, mapped.family, file_names, patch.all_source_keys())
            continue
        params = _own_parameters(module)
        fitting = TargetPatch(module=dest)
        keys_of = patch.source_keys
        if patch.low_rank is not None:
            low_rank_keys = {part: keys for part, keys in keys_of.items() if part in low_rank_parts()}
            if "weight" in params:
                _check_low_rank(lora.name, where, dest, patch, params["weight"])
                fitting.low_rank = patch.low_rank
                fitting.source_keys.update(low_rank_keys)
            else:
                acc.unmatched.extend(key for keys in low_rank_keys.values() for key in keys)
        for param, diff in patch.param_diffs.items():
            keys = tuple(keys_of.get(param, ()))
            if param not in params:
                acc.unmatched.extend(keys)
                continue
            if tuple(diff.shape) != logical_shape(params[param]):
                raise KeyMatchError(
                    f"{lora.name}: {keys[0] if keys else dest!r} does not fit {where} parameter {dest}.{param}: "
                    f"expected shape {logical_shape(params[param])}, got {tuple(diff.shape)}")
            fitting.param_diffs[param] = diff
            fitting.source_keys[param] = keys
        if fitting.low_rank is not None or fitting.param_diffs:
            if dest in acc.applied:  # a parameter diff re-targeted onto a module that has other parts
                existing = acc.applied[dest]
                existing.param_diffs.update(fitting.param_diffs)
                existing.source_keys = merged_keys(existing.source_keys, fitting.source_keys)
            else:
                acc.applied[dest] = fitting

    _summarise(acc)
    if acc.unmatched:
        family_hint = _family_hint(lora, mapped.family, guess_family)
        acc.refusal = (f"{lora.name}: {len(acc.unmatched)} key(s) match nothing in the {where}: "
                       f"{_first(acc.unmatched)}. {family_hint}{_what_to_do(acc, bool(family_hint), caller)}")
        if not lenient:
            raise KeyMatchError(acc.refusal)
    return acc


def _what_to_do(acc: KeyAccounting, another_family: bool, caller: str) -> str:
    """The way out of a refusal, in the caller's words (``caller``: the node or command that asked). Skipping the
    keys (``lenient``) is offered only where some keys apply to this model: another family's file, or one none of
    whose keys match, would be skipped whole (issue 54: a Qwen-Image LoRA in the Wan pair, all 72 keys dropped),
    and a node that applies nothing must not be suggested."""
    if another_family:
        return "Pick a LoRA made for this model"
    if not acc.applied:
        return ("Check that the LoRA is for this model: none of its keys applies to it, so skipping the unmatched "
                "ones ('lenient') would apply nothing")
    if caller.startswith("lorabind "):
        skip = f"'{caller} --lenient'"
    elif caller:
        skip = f"{caller}'s 'lenient' input"
    else:
        skip = "the fuse and adapter nodes' 'lenient' input, 'lorabind merge --lenient', 'lorabind inspect --lenient'"
    return f"Check that the LoRA is for this model, or skip these keys explicitly: {skip}"


def _family_hint(lora, model_family: str, guess_family: Optional[Callable]) -> str:
    """Name the family a wrong-model LoRA seems to be for: the most common cause of unmatched keys."""
    guessed = guess_family(lora) if guess_family is not None else None
    if guessed is None or model_family in guessed.model_families:
        return ""
    return (f"They are another model family's keys: the file's module names look like a "
            f"{'/'.join(guessed.model_families)} LoRA, not one for this {model_family} model. ")


def _as_parameter_diff(modules: dict, dest: str, patch: TargetPatch) -> tuple:
    """``<module>.<param>.diff`` names a parameter, not a module (e.g. ``blocks.0.scale_shift_table.diff``, as
    ``lorabind extract`` writes it): re-target that full diff onto ``<param>`` of ``<module>``."""
    owner, _, name = dest.rpartition(".")
    if dest in modules or patch.low_rank is not None or set(patch.param_diffs) != {"weight"} \
            or owner not in modules or name not in _own_parameters(modules[owner]):
        return dest, patch
    return owner, TargetPatch(module=owner, param_diffs={name: patch.param_diffs["weight"]},
                              source_keys={name: tuple(patch.source_keys.get("weight", ()))})


def _own_parameters(module) -> dict:
    """A module's own parameters, seen through a peft wrapper (a dynamic adapter injected into the same model
    moves ``weight``/``bias`` to ``<module>.base_layer``; peft's ``weight``/``bias`` properties forward there)."""
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    return dict(base.named_parameters(recurse=False))


def _file_names_by_key(mapped: MappedLora) -> dict:
    """raw key -> the file-side name the family's ``expected_unmatched_reason`` understands: the module's name,
    or ``<module>.<parameter>`` for a diff of another parameter."""
    names = {}
    for name, patch in mapped.source.targets.items():
        for part, keys in patch.source_keys.items():
            owner = name if part in low_rank_parts() or part in ("weight", "bias") else f"{name}.{part}"
            names.update({raw: owner for raw in keys})
    return names


def _not_in_model(acc, keymap, model_family, file_names, keys) -> None:
    """A mapped module the model lacks: expected when the family can say why (e.g. no image branch)."""
    for raw in keys:
        reason = keymap.expected_unmatched_reason(file_names.get(raw, raw), model_family)
        if reason is None:
            acc.unmatched.append(raw)
        else:
            acc.expected_unmatched[raw] = reason


def _check_low_rank(file_name, where, dest, patch, weight) -> None:
    """The kind's delta must have the weight's shape (low-rank conv: ``[out, r, 1, ..] @ [r, in, *k]``)."""
    shape = logical_shape(weight)  # a GGUF weight's matrix shape, not its bytes'
    got = patch.low_rank.delta_shape(shape)
    if got is None or tuple(got) != shape:
        factors = " and ".join(repr(key) for part, keys in patch.source_keys.items() if part in low_rank_parts()
                               and part != "alpha" for key in keys) or repr(dest)
        shapes = ", ".join(str(tuple(t.shape)) for t in patch.low_rank.tensors())
        raise KeyMatchError(
            f"{file_name}: {factors} do not fit {where} parameter {dest}.weight: expected shape "
            f"{shape}, got {tuple(got) if got else 'no matching layout'} "
            f"({patch.low_rank.kind} factors {shapes})")


def _summarise(acc: KeyAccounting) -> None:
    acc.counts = {"applied": sum(len(p.all_source_keys()) for p in acc.applied.values()),
                  "expected_unmatched": len(acc.expected_unmatched), "unmatched": len(acc.unmatched)}
    deltas = [p.low_rank for p in acc.applied.values() if p.low_rank is not None]
    acc.ranks = {d.rank for d in deltas}
    acc.rank = next(iter(acc.ranks)) if len(acc.ranks) == 1 else None
    alphas = {d.alpha for d in deltas}
    acc.alpha = next(iter(alphas)) if len(alphas) == 1 else None
    scales = {d.scale for d in deltas}
    acc.scale = next(iter(scales)) if len(scales) == 1 else None
    by_reason: dict = {}
    for raw, reason in acc.expected_unmatched.items():
        by_reason.setdefault(reason, []).append(raw)
    for reason, keys in by_reason.items():
        acc.warnings.append(f"{acc.file}: {len(keys)} key(s) not applied to the {acc.component}, as expected: "
                            f"{reason} ({_first(keys)})")
    if acc.unmatched:
        acc.warnings.append(f"{acc.file}: {len(acc.unmatched)} key(s) match nothing in the {acc.component} "
                            f"({acc.family}) and are ignored: {_first(acc.unmatched)}")


def _first(keys: list) -> str:
    shown = ", ".join(keys[:_SHOWN_KEYS])
    return shown + (f" ... and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else "")
