"""``--config FILE`` of ``lorabind merge`` and ``extract``: JSON or YAML, in our names or LightX2V's.

Why: people come with LightX2V's converter and extractor configs. The keys that mean the same thing as one of
ours are read as ours (``MERGE_ALIASES`` for the converter's, ``EXTRACT_ALIASES`` for the extractor's); the ones
whose meaning we do not reproduce are refused naming the key and what to do instead (``REFUSED``, or a value
outside ``ACCEPTED_VALUES``), never silently ignored: a merge that quietly dropped ``lora_alpha`` would bake a
different strength than the user asked for. The file is bounded (``MAX_CONFIG_BYTES``) and must hold one
mapping; YAML is read with ``safe_load`` (no object construction).
"""

from __future__ import annotations

import os

from ..errors import LoraBindError
from ..io import json_limits

MAX_CONFIG_BYTES = 1024 * 1024
# LightX2V's name -> ours: the converter's (``tools/convert/converter.py``) for merge, the extractor's
# (``tools/extract/lora_extractor.py``: source/target model, output, rank, output dtype) for extract
MERGE_ALIASES = {"source": "model", "output": "out", "lora_path": "lora", "lora_strength": "strength",
                 "output_dtype": "dtype", "save_dtype": "dtype"}
EXTRACT_ALIASES = {"source_model": "base", "target_model": "tuned", "output": "out", "output_dtype": "dtype"}
REFUSED = {
    "lora_alpha": "lorabind scales each pair by the file's own alpha/rank (LightX2V's rule when a file has alpha "
                  "tensors); give the strength instead",
    "alpha": "lorabind scales each pair by the file's own alpha/rank; give the strength instead",
    "lora_dynamic_apply": "merge always fuses; for an unfused LoRA use the LoRA nodes or `lorabind run`",
    "lazy_load": "merge already streams one tensor at a time; remove the key",
    "dit_quantized": "give the quantized file as --model: its fp8 weights are read with their scales",
    "quant_scheme": "the output precision is --dtype (bf16, fp16, fp32 or fp8_e4m3fn)",
    "model_type": "the model family is detected from the file; remove the key",
    "parallel": "merge runs in one process; remove the key",
}
# keys LightX2V's configs carry that change nothing here, each accepted with what lorabind does instead (said)
NOTED = {"lora_merge_force_fp32": "lorabind always merges in fp32 (each LoRA's product is added to the weight in "
                                   "fp32 and the sum is cast once), whatever the key says"}
# keys whose LightX2V values we do reproduce, and only those values
ACCEPTED_VALUES = {"lora_key_convert": ("auto", "same"), "direction": ("forward",), "diff_only": (False,),
                   "single_file": (True, False), "source_type": ("safetensors",), "target_type": ("safetensors",),
                   "output_format": ("safetensors",)}


class ConfigError(LoraBindError):
    """A --config file that cannot be read or holds a key lorabind does not reproduce."""


def read_config(path: str) -> dict:
    """The file's mapping: YAML for ``.yaml``/``.yml``, JSON otherwise (``ConfigError`` naming the file)."""
    try:
        if os.path.getsize(path) > MAX_CONFIG_BYTES:
            raise ConfigError(f"--config {path}: larger than {MAX_CONFIG_BYTES} bytes; a config is a few lines")
        with open(path, encoding="utf-8") as handle:
            if str(path).lower().endswith((".yaml", ".yml")):
                import yaml

                config = yaml.safe_load(handle)
            else:
                config = json_limits.load(handle)
    except ConfigError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"--config {path}: cannot be read ({exc})") from None
    except Exception as exc:  # yaml.YAMLError: its classes are imported lazily
        raise ConfigError(f"--config {path}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--config {path}: must hold one mapping of keys to values, got {type(config).__name__}")
    return config


def config_notes(path) -> list:
    """What lorabind says about the ``NOTED`` keys of the config at ``path`` (None: no config), one line each."""
    if not path:
        return []
    return [f"--config {path}: '{key}': {NOTED[key]}" for key in read_config(path) if key in NOTED]


def translate(config: dict, path: str, known, aliases: dict) -> dict:
    """``config`` in our names, restricted to ``known`` (our names first, then LightX2V's ``aliases``; its
    accepted keys are dropped once checked): ``ConfigError`` naming the first key that is refused, unknown or has
    a value we do not reproduce. Our own names win over ``REFUSED``: ``alpha`` is an extract option of ours and
    a LightX2V merge strength we refuse."""
    out = {}
    for key, value in config.items():
        if key in known or key in aliases:
            out[key if key in known else aliases[key]] = value
        elif key in NOTED:
            continue  # said by ``config_notes``
        elif key in REFUSED:
            raise ConfigError(f"--config {path}: LightX2V's '{key}' is not supported: {REFUSED[key]}")
        elif key in ACCEPTED_VALUES:
            if value not in ACCEPTED_VALUES[key]:
                raise ConfigError(f"--config {path}: '{key}: {value}' is not supported (lorabind does "
                                  f"{', '.join(repr(v) for v in ACCEPTED_VALUES[key])})")
        else:
            raise ConfigError(f"--config {path}: unknown key '{key}'; known: {sorted(set(known) | set(aliases))}")
    return out
