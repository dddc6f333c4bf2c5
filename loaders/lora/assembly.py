"""Group a file's parsed keys into one ``TargetPatch`` per module; the module's adapter kind (``kinds``) builds
its weight delta and resolves its scale (the plain LoRA's rules are in ``kinds/low_rank.py``; a PEFT config,
``adapter_config.json`` or diffusers' embedded ``lora_adapter_metadata``, is read here as ``PeftScaling``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import regex

from ..errors import LoraFileError
from . import kinds
from .canonical import TargetPatch

# PEFT's rank_pattern/alpha_pattern keys are regexes from a file: their matching time must be bounded. A
# pattern like "(x+x+)+y" backtracks exponentially in Python's re (11.8 s for 26-character names), and re has no
# timeout; the ``regex`` module (a transformers dependency) matches the same syntax with a ``timeout``. A config
# whose patterns need more than this in total over all of a file's modules is refused as pathological.
PATTERN_MATCH_BUDGET_S = 1.0
MAX_PATTERN_CHARS = 1000
_LORA_B_BIAS_SUFFIXES = (".lora_B.bias", ".lora_B.default.bias")


@dataclass(frozen=True)
class PeftScaling:
    """The scaling part of a PEFT ``LoraConfig`` (only what decides ``scale``)."""

    r: int
    lora_alpha: float
    rank_pattern: dict = field(default_factory=dict)
    alpha_pattern: dict = field(default_factory=dict)
    use_rslora: bool = False
    source: str = ""
    use_dora: bool = False  # every LoRA module then carries a ``lora_magnitude_vector`` (``kinds/dora.py``)
    _spent: list = field(default_factory=lambda: [0.0], compare=False, repr=False)  # seconds spent matching

    @classmethod
    def from_config(cls, config: dict, source: str) -> "PeftScaling":
        """Read a PEFT/diffusers LoRA config; ``source`` names the file for errors."""
        try:
            r = int(config.get("r", 8))  # LoraConfig's defaults: r=8, lora_alpha=8
            alpha = float(config.get("lora_alpha", 8))
            rank_pattern = {str(k): int(v) for k, v in (config.get("rank_pattern") or {}).items()}
            alpha_pattern = {str(k): float(v) for k, v in (config.get("alpha_pattern") or {}).items()}
            for pattern in (*rank_pattern, *alpha_pattern):
                if len(pattern) > MAX_PATTERN_CHARS:
                    raise ValueError(f"pattern longer than {MAX_PATTERN_CHARS} characters: {pattern[:40]!r}...")
                _compiled(pattern)
        except (TypeError, ValueError, AttributeError, regex.error) as exc:
            raise LoraFileError(f"{source}: adapter config has an invalid r/lora_alpha/pattern ({exc})") from exc
        if not all(math.isfinite(a) for a in (alpha, *alpha_pattern.values())):
            raise LoraFileError(f"{source}: adapter config lora_alpha/alpha_pattern must be finite numbers "
                                f"(lora_alpha={alpha}, alpha_pattern={alpha_pattern})")
        if r < 1 or any(v < 1 for v in rank_pattern.values()):
            raise LoraFileError(f"{source}: adapter config rank must be at least 1 "
                                f"(r={r}, rank_pattern={rank_pattern})")
        return cls(r, alpha, rank_pattern, alpha_pattern, bool(config.get("use_rslora", False)), source,
                   use_dora=bool(config.get("use_dora", False)))

    def rank_and_alpha(self, module: str) -> tuple[int, float]:
        return (self._pattern_value(self.rank_pattern, module, self.r),
                self._pattern_value(self.alpha_pattern, module, self.lora_alpha))

    def _pattern_value(self, patterns: dict, module: str, default):
        """PEFT's rule (``peft.utils.other.get_pattern_key``): the first pattern ``p`` with
        ``re.match(rf"(.*\\.)?({p})$", module)`` wins; here within ``PATTERN_MATCH_BUDGET_S`` in total."""
        for pattern, value in patterns.items():
            left = PATTERN_MATCH_BUDGET_S - self._spent[0]
            start = time.monotonic()
            try:
                matched = left > 0 and _compiled(pattern).match(module, timeout=left)
            except TimeoutError:  # the regex module may stop a little before ``left`` is spent: over budget
                matched, self._spent[0] = None, PATTERN_MATCH_BUDGET_S
            self._spent[0] += time.monotonic() - start
            if self._spent[0] >= PATTERN_MATCH_BUDGET_S:
                raise LoraFileError(
                    f"{self.source}: adapter config pattern {pattern[:80]!r} takes too long to match module names "
                    f"(over {PATTERN_MATCH_BUDGET_S:g} s; a regex with nested repetition); simplify the pattern")
            if matched:
                return value
        return default


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str):
    return regex.compile(rf"(.*\.)?({pattern})$")


def assemble_targets(parsed: list, tensors, display_name: str, peft: Optional[PeftScaling]) -> dict:
    """``parsed``: ParsedKey list; ``tensors``: mapping raw key -> tensor. Returns module -> TargetPatch.

    Errors name the file and key: a factor without its other half, an alpha without a pair, two keys for the
    same role of one module (e.g. both ``lora_A`` and ``lora_down``), factor shapes that do not chain.
    """
    groups: dict = {}  # module -> {role: raw key}
    for key in parsed:
        roles = groups.setdefault(key.module, {})
        if key.role in roles:
            raise LoraFileError(f"{display_name}: keys {roles[key.role]!r} and {key.raw!r} both give the "
                                f"{key.role} of module {key.module!r}")
        roles[key.role] = key.raw

    targets = {}
    for module, roles in groups.items():
        patch = TargetPatch(module=module, source_keys={role: (raw,) for role, raw in roles.items()})
        patch.low_rank = kinds.build_delta(module, roles, tensors, display_name, peft)
        if peft is not None and peft.use_dora and patch.low_rank is not None and patch.low_rank.kind != "dora":
            raise LoraFileError(f"{display_name}: adapter config says use_dora=true, but module {module!r} has no "
                                f"lora_magnitude_vector (DoRA magnitude); the adapter file is incomplete")
        if patch.low_rank is None and "alpha" in roles:
            raise LoraFileError(f"{display_name}: {roles['alpha']!r} has no lora_down/lora_up (lora_A/lora_B) "
                                f"pair for module {module!r}")
        for param, diff in kinds.build_full_diffs(module, roles, tensors, display_name, peft).items():
            patch.param_diffs[param] = diff.tensor
        if patch.low_rank is not None and roles.get("bias", "").endswith(_LORA_B_BIAS_SUFFIXES):
            # PEFT lora_bias: the bias of lora_B is part of the adapter's output, ``lora_B(lora_A(x)) * scaling``,
            # so it is scaled like the weights (peft merges ``bias + lora_B.bias * scaling``); a diff_b is not.
            patch.param_diffs["bias"] = patch.param_diffs["bias"] * patch.low_rank.scale
        targets[module] = patch
    return targets

