"""Key layouts as data: one component's diffusers names <-> the names in its native single files (what ComfyUI
users have in ``models/diffusion_models``, ``vae``, ``text_encoders``).

Each rule pairs a diffusers module path with the native one; ``{i}`` / ``{j}`` stand for block indices, and the
rest of the key (``.weight``, ``.bias``, ``.gamma``) is carried over. Rules are tried in order and the first
full match wins; keys no rule names are the same in both layouts. Why here, below the families: each family
declares the layouts of its own files (``families/<family>/``), and the single-file loader reads them all the
same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Optional


def _template_regex(template: str) -> re.Pattern:
    pattern = re.escape(template)
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", pattern)
    return re.compile(rf"{pattern}(?P<_rest>\..+)?")


@dataclass(frozen=True)
class Fused:
    """One native tensor (``native`` template) that is several diffusers tensors (``parts`` templates)
    concatenated along dim 0 (MiniMax-H3 ``qkv_proj``), or one diffusers tensor with its two halves swapped
    (``swap_halves``: MiniMax-H3 files store SwiGLU's ``[gate; value]``, diffusers reads ``[value; gate]``)."""
    native: str
    parts: tuple[str, ...]
    swap_halves: bool = False


@dataclass
class KeyLayout:
    """The bidirectional key mapping of one component kind."""
    name: str
    rules: tuple[tuple[str, str], ...]  # (diffusers template, native template)
    fused: tuple[Fused, ...] = ()
    native_only: tuple[str, ...] = ()  # native keys diffusers recomputes (dropped on load)
    diffusers_only: tuple[str, ...] = ()  # diffusers keys that are tied copies (not written)
    _compiled: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        self._compiled = [(_template_regex(d), d, _template_regex(n), n) for d, n in self.rules]

    @staticmethod
    def _rewrite(key: str, pairs) -> Optional[str]:
        for regex, target in pairs:
            match = regex.fullmatch(key)
            if match:
                groups = {k: v for k, v in match.groupdict().items() if k != "_rest"}
                return target.format(**groups) + (match["_rest"] or "")
        return None

    def to_native(self, key: str) -> str:
        renamed = self._rewrite(key, [(d, n) for d, _, _, n in self._compiled])
        return key if renamed is None else renamed

    def to_diffusers(self, key: str) -> str:
        renamed = self._rewrite(key, [(n, d) for _, d, n, _ in self._compiled])
        return key if renamed is None else renamed

    def native_plan(self, diffusers_keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """native key -> the diffusers keys it holds (one, or a fused rule's parts in order)."""
        keys = [k for k in diffusers_keys if k not in self.diffusers_only]
        plan: dict[str, tuple[str, ...]] = {}
        claimed: set[str] = set()
        for rule in self.fused:
            first = _template_regex(rule.parts[0])
            for key in keys:
                match = first.fullmatch(key)
                if match:
                    groups = {k: v for k, v in match.groupdict().items() if k != "_rest"}
                    rest = match["_rest"] or ""
                    parts = tuple(p.format(**groups) + rest for p in rule.parts)
                    plan[rule.native.format(**groups) + rest] = parts
                    claimed.update(parts)
        for key in keys:
            if key not in claimed:
                plan[self.to_native(key)] = (key,)
        return plan

    def diffusers_parts(self, native_key: str) -> tuple[str, ...]:
        """The diffusers keys one native key holds, in ``join`` order: a fused rule's parts, else its one name
        (the inverse of ``native_plan``, for a model known only by its native names: a host's state dict)."""
        for rule in self.fused:
            match = _template_regex(rule.native).fullmatch(native_key)
            if match:
                groups = {k: v for k, v in match.groupdict().items() if k != "_rest"}
                return tuple(part.format(**groups) + (match["_rest"] or "") for part in rule.parts)
        return (self.to_diffusers(native_key),)

    def fused_rule(self, native_key: str) -> Optional[Fused]:
        for rule in self.fused:
            if _template_regex(rule.native).fullmatch(native_key):
                return rule
        return None

    def split(self, native_key: str, tensor, diffusers_keys: tuple[str, ...]) -> dict:
        """The diffusers tensors one native tensor holds (the inverse of ``join``)."""
        import torch

        rule = self.fused_rule(native_key)
        if rule is None:
            return {diffusers_keys[0]: tensor}
        if rule.swap_halves:
            first, second = tensor.chunk(2, dim=0)
            return {diffusers_keys[0]: torch.cat([second, first], dim=0)}
        return dict(zip(diffusers_keys, tensor.chunk(len(diffusers_keys), dim=0)))

    def join(self, native_key: str, tensors: list):
        """One native tensor from its diffusers parts (``native_plan`` order)."""
        import torch

        rule = self.fused_rule(native_key)
        if rule is not None and rule.swap_halves:
            first, second = tensors[0].chunk(2, dim=0)
            return torch.cat([second, first], dim=0)
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
