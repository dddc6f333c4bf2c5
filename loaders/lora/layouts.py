"""Key grammar of every LoRA layout seen in the wild, turned into one form: ``(module name, role)``.

A raw key is ``<prefix><module><suffix>``. Prefixes name who wrote the file (``diffusion_model.`` for
ComfyUI/LightX2V native files, ``transformer.`` for diffusers pipeline saves, ``base_model.model.`` for PEFT,
``pipe.dit.`` for DiffSynth-Studio, ``lora_unet_`` for kohya/musubi, ``lora_transformer_`` for OneTrainer and
``lycoris_`` for LyCORIS, which all flatten the module dots into underscores). Suffixes name the tensor's role. The module name left in the middle is
still in the file's own naming; the family modules map it.

Roles: the parts an adapter kind claims (``down`` / ``up`` of the low-rank pair, ``hada_w1_a`` ... of LoHa, see
``kinds``), ``alpha`` (scalar), ``weight`` / ``bias`` (full deltas
``.diff`` / ``.diff_b``, PEFT ``lora_B.bias``), ``modulation`` (Wan ``blocks.N.diff_m``, a delta of the block's
modulation parameter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import kinds

_ALPHA_SUFFIX = (".alpha", "alpha")


def suffix_roles() -> tuple:
    """Every known ``(suffix, role)``: the registered adapter kinds' first, then ``.alpha``, then the full diffs'
    (``kinds/full_diff.py``), whose short ``.diff`` must come after every longer suffix."""
    return kinds.suffix_parts() + (_ALPHA_SUFFIX,) + kinds.full_diff_suffix_parts()


# Prefixes that only say who wrote the file. Checked repeatedly (PEFT wrapping a diffusers save gives
# "base_model.model.transformer."). "transformer." with its dot never eats Qwen's "transformer_blocks".
# "pipe.dit." is DiffSynth-Studio's (and kijai's) name for the denoiser when a whole pipeline was saved.
_DOTTED_PREFIXES = ("base_model.model.", "model.diffusion_model.", "diffusion_model.", "transformer.", "pipe.dit.")
# kohya/musubi/LyCORIS write the module path with underscores instead of dots. Wan "Fun" files double the
# underscore ("lora_unet__blocks_0_cross_attn_k"; ComfyUI's convert_lora_wan_fun strips one), so that spelling
# comes first.
_FLATTENED_PREFIXES = ("lora_unet__", "lora_unet_", "lora_transformer_", "lycoris_")



@dataclass(frozen=True)
class ParsedKey:
    raw: str
    module: str  # prefix and suffix removed; underscores still flat for kohya names
    role: str
    prefix: str  # the prefixes removed, concatenated ("" when none)


def parse_key(raw: str) -> Optional[ParsedKey]:
    """Split a raw key into module name and role; None when the suffix is not a LoRA tensor suffix."""
    found = next(((suffix, role) for suffix, role in suffix_roles() if raw.endswith(suffix)), None)
    if found is None:
        return None
    suffix, role = found
    body = raw[: -len(suffix)]
    if suffix.startswith("_lora."):
        body = _old_diffusers_processor_name(body)
    prefix = ""
    stripped = True
    while stripped:
        stripped = False
        for candidate in _DOTTED_PREFIXES + _FLATTENED_PREFIXES:
            if body.startswith(candidate) and len(body) > len(candidate):
                prefix += candidate
                body = body[len(candidate):]
                stripped = candidate in _DOTTED_PREFIXES
                break
    if not body:
        return None
    return ParsedKey(raw=raw, module=body, role=role, prefix=prefix)


def _old_diffusers_processor_name(body: str) -> str:
    """``attn1.processor.to_out_lora`` -> ``attn1.to_out.0`` (the module the old processor LoRA wrapped)."""
    body = body.replace(".processor.", ".")
    return body + ".0" if body.endswith(".to_out") else body


def describe_format(parsed: list, *, peft_folder: bool) -> str:
    """A short id of the layout that was detected, for reports:

    - ``peft-folder``: an adapter folder; ``peft``: ``base_model.model.`` keys;
    - ``kohya``: flattened ``lora_unet_`` / ``lora_transformer_`` / ``lycoris_`` names (Wan Fun's ``lora_unet__`` too);
    - ``diffsynth``: PEFT's in-memory ``.lora_A.default.weight`` names without a diffusers prefix, as
      DiffSynth-Studio (and kijai, with ``pipe.dit.``) save them;
    - ``comfyui``: ``diffusion_model.`` with ``lora_A``/``lora_B`` (ComfyUI's and musubi-tuner's exports);
    - ``lightx2v-native``: ``diffusion_model.`` with ``lora_down``/``lora_up`` (LightX2V's distill files);
    - ``diffusers``: ``lora_A``/``lora_B`` without prefix or with ``transformer.``; ``lora-down-up`` otherwise.
    """
    if peft_folder:
        return "peft-folder"
    prefixes = {p.prefix for p in parsed}
    low_rank_a = any(p.raw.endswith((".lora_A.weight", ".lora_A.default.weight")) for p in parsed)
    if any(p.startswith(_FLATTENED_PREFIXES) for p in prefixes):
        return "kohya"
    if any(p.startswith("base_model.model.") for p in prefixes):
        return "peft"
    if any(".default." in p.raw for p in parsed) and prefixes <= {"", "pipe.dit."}:
        return "diffsynth"
    if any("diffusion_model." in p for p in prefixes):
        return "comfyui" if low_rank_a else "lightx2v-native"
    if low_rank_a:
        return "diffusers"
    return "lora-down-up"


def redot(name: str, tokens: frozenset) -> str:
    """Re-insert the dots of a kohya/musubi flattened module name using a family's multi-word name parts.

    ``blocks_0_self_attn_q`` with tokens {"self_attn", ...} -> ``blocks.0.self_attn.q``. Each dotted segment
    is split on ``_`` and the longest run of pieces forming a known token is glued back; unknown runs become
    separate segments. Idempotent on properly dotted names whose segments are tokens or plain words, so hybrid
    keys such as ``blocks_22.self_attn.k`` (seen from musubi) come out right too.
    """
    longest = max((t.count("_") + 1 for t in tokens), default=1)
    out = []
    for segment in name.split("."):
        pieces = segment.split("_")
        i = 0
        while i < len(pieces):
            for length in range(min(longest, len(pieces) - i), 0, -1):
                candidate = "_".join(pieces[i:i + length])
                if length == 1 or candidate in tokens:
                    out.append(candidate)
                    i += length
                    break
    return ".".join(out)
