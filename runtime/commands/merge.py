"""``lorabind merge --model DIR|FILE [--model FILE] --lora [COMPONENT=]FILE[:STRENGTH] ... --out DIR|FILE ...``.

A diffusers folder in: a complete folder out with the LoRA(s) fused into its denoiser components (both Wan2.2
experts in one run), without loading the model (``loaders.offline.merging``). Single files in (ComfyUI's denoiser files,
bf16 or fp8; two Wan2.2 experts high-noise first): one single file out per file, bf16 by default or fp8 scaled
with ``--dtype fp8_e4m3fn`` (``loaders.offline.single_file_merge``). ``--config`` reads the same settings, or LightX2V's
converter keys, from JSON or YAML (``loaders.offline.tool_config``; command-line values win). Module-level imports stay
light: ``lorabind --help`` must not import torch.
"""

from __future__ import annotations

import json
import os
import sys

from ..guide_flags import add_format_arguments, dtype_name, format_refusal
from . import DTYPE_ARGUMENTS

EXIT_REFUSED = 1
FP8_DTYPE = "fp8_e4m3fn"  # single files only
CONFIG_KEYS = ("model", "lora", "strength", "lora_configs", "out", "component", "dtype", "overwrite",
               "asset_mode", "lenient")
LORA_CONFIG_KEYS = ("path", "strength", "name")


def add_arguments(parser) -> None:
    parser.add_argument("--model", "--source-model", dest="model", action="append", metavar="DIR|FILE",
                        help="source diffusers model folder, or a single denoiser .safetensors file (read only); "
                             "repeat for the two Wan2.2 expert files, high-noise first")
    parser.add_argument("--lora", "--lora-model", dest="lora", action="append", metavar="[COMPONENT=]FILE[:STRENGTH]",
                        help="LoRA file or PEFT folder, optionally with the component it goes into and a strength "
                             "(default 1.0); repeatable, e.g. --lora transformer=HIGH.safetensors --lora "
                             "transformer_2=LOW.safetensors bakes a Wan2.2 pair in one run")
    parser.add_argument("--alpha", type=float, default=None, metavar="STRENGTH",
                        help="strength of every --lora that gives none (LightX2V's lora_merger --alpha; each pair "
                             "is still scaled by its file's own alpha/rank; default 1.0)")
    parser.add_argument("--component", default=None, metavar="NAME",
                        help="component for --lora values that name none (default: the model's main denoiser, "
                             "e.g. transformer; Wan2.2 low-noise: transformer_2)")
    parser.add_argument("--out", "--output", dest="out", action="append", metavar="DIR|FILE",
                        help="new model folder to write (a new path or an empty folder; never inside --model or "
                             "a LoRA); for single files one .safetensors file per --model, in the same order")
    add_format_arguments(parser, ("--source-type", "--lora-type", "--output-format"))
    parser.add_argument("--config", metavar="FILE",
                        help="JSON or YAML file with any of the settings above (model, lora, strength, out, "
                             "component, dtype, ...) or LightX2V's converter keys (source, output, lora_path, "
                             "lora_strength, lora_configs: [{path, strength, name: high_noise_model}]); keys "
                             "lorabind does not reproduce (lora_alpha, ...) are refused by name")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out that an earlier merge wrote (only once the new output is "
                             "complete); any other existing path is refused")
    parser.add_argument("--asset-mode", choices=("copy", "symlink", "hardlink"), default=None,
                        help="folders: how files the merge does not change reach --out (default copy; "
                             "symlink/hardlink save the space of text encoders and VAE)")
    parser.add_argument("--dtype", "--output-dtype", dest="dtype", type=dtype_name,
                        choices=sorted(DTYPE_ARGUMENTS) + [FP8_DTYPE], default=None,
                        help="dtype of the merged tensors (folders: default as stored; single files: default "
                             "bf16, or fp8_e4m3fn: fp8 scaled with a per-tensor scale_weight)")
    parser.add_argument("--lenient", action="store_true",
                        help="ignore LoRA keys that match nothing in the model (reported) instead of refusing")


def parse_lora_argument(value: str, default_component: str, default_strength: float = 1.0) -> tuple[str, str, float]:
    """``[COMPONENT=]FILE[:STRENGTH]`` -> (component, file, strength). The ``COMPONENT=`` prefix counts only when
    it names a component-like word (no path separator); the last ``:`` part is a strength only when it parses as
    a number (else ``default_strength``)."""
    component, sep, rest = value.partition("=")
    if not sep or "/" in component or "\\" in component or not component:
        component, rest = default_component, value
    path, sep, tail = rest.rpartition(":")
    if sep:
        try:
            return component, path, float(tail)
        except ValueError:
            pass
    return component, rest, default_strength


def run(args) -> int:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.offline.tool_config import config_notes

    refused = format_refusal(args)
    if refused:
        print(f"lorabind merge: refused: {refused}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        settings = _settings(args)
        for note in config_notes(args.config):
            print(f"lorabind merge: {note}")
        report = _merge(settings)
    except LoraBindError as exc:
        print(f"lorabind merge: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:  # e.g. a full disk: the half-written output is already gone
        print(f"lorabind merge: failed, nothing written to {', '.join(args.out or [])}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"lorabind merge: wrote {', '.join(settings['out'])}")
    print(json.dumps(report, indent=2))
    return 0


def _merge(settings: dict) -> dict:
    """The folder merge, the single-file merge or a lone component folder's, by what ``--model`` names."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.models.single_file.shard_folders import is_shard_folder
    from ...loaders.offline.component_folders import component_class_of, merge_component_folder
    from ...loaders.offline.merging import merge_into_folder
    from ...loaders.offline.single_file_merge import DEFAULT_DTYPE, merge_into_files

    models, outs, dtype = settings["model"], settings["out"], settings.get("dtype")
    options = dict(lenient=bool(settings.get("lenient")), overwrite=bool(settings.get("overwrite")))
    if len(models) == len(outs) == 1 and component_class_of(models[0]) is not None:  # a lone transformer/
        return merge_component_folder(models[0], settings["loras"], outs[0], component=settings.get("component"),
                                      dtype=_torch_dtype(dtype), **options)
    # files, or folders of shards without model_index.json (LightX2V's high_noise_model/): single-file merges
    if all(os.path.isfile(m) or is_shard_folder(m) for m in models):
        return merge_into_files(models, settings["loras"], outs, component=settings.get("component"),
                                dtype=dtype or DEFAULT_DTYPE, **options)
    if len(models) != 1 or len(outs) != 1:
        raise LoraBindError(f"--model {models}: give one model folder and one --out, or single .safetensors files "
                            "(one --out each)")
    return merge_into_folder(models[0], settings["loras"], outs[0], component=settings.get("component"),
                             asset_mode=settings.get("asset_mode") or "copy", dtype=_torch_dtype(dtype), **options)


def _torch_dtype(dtype):
    """``--dtype`` (our spelling) as the torch dtype of a folder merge, None for "as stored"."""
    import torch

    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError

    if dtype == FP8_DTYPE:
        raise LoraBindError("--dtype fp8_e4m3fn writes single files; a folder merge takes fp32, bf16 or fp16")
    return getattr(torch, DTYPE_ARGUMENTS[dtype]) if dtype else None


def _settings(args) -> dict:
    """The config file's settings (our names or LightX2V's), overridden by the command line's."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.offline.tool_config import MERGE_ALIASES, read_config, translate

    config = (translate(read_config(args.config), args.config, CONFIG_KEYS, MERGE_ALIASES) if args.config
              else {})
    explicit = {"model": args.model, "out": args.out, "component": args.component, "dtype": args.dtype,
                "asset_mode": args.asset_mode, "overwrite": args.overwrite or None, "lenient": args.lenient or None}
    settings = {**config, **{k: v for k, v in explicit.items() if v is not None}}
    settings["model"], settings["out"] = _listed(settings.get("model")), _listed(settings.get("out"))
    component = settings.get("component")
    strength = 1.0 if args.alpha is None else args.alpha
    settings["loras"] = ([parse_lora_argument(v, component, strength) for v in args.lora] if args.lora
                         else _config_loras(config, args.config))
    for name, flag in (("model", "--model"), ("out", "--out"), ("loras", "--lora")):
        if not settings[name]:
            raise LoraBindError(f"give {flag} (on the command line or in --config)")
    return settings


def _listed(value) -> list:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else ([str(value)] if value else [])


def _config_loras(config: dict, path: str) -> list:
    """LoRAs of a config: ``lora`` (+ ``strength``, one number or one per file) and LightX2V's ``lora_configs``
    entries, whose ``name`` (``high_noise_model``...) says the expert as a file name would."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.offline.tool_config import REFUSED, ConfigError

    files, strengths = _listed(config.get("lora")), config.get("strength", 1.0)
    strengths = strengths if isinstance(strengths, list) else [strengths] * len(files)
    if len(strengths) != len(files):
        raise ConfigError(f"--config {path}: {len(files)} LoRA file(s) but {len(strengths)} strength(s)")
    loras = [(None, file, float(strength)) for file, strength in zip(files, strengths)]
    for index, entry in enumerate(config.get("lora_configs") or []):
        where = f"--config {path}: lora_configs[{index}]"
        if not isinstance(entry, dict) or "path" not in entry:
            raise ConfigError(f"{where} must be a mapping with a 'path'")
        for key in entry:
            if key in REFUSED:
                raise ConfigError(f"{where}: '{key}' is not supported: {REFUSED[key]}")
            if key not in LORA_CONFIG_KEYS:
                raise ConfigError(f"{where}: unknown key '{key}'; known: {list(LORA_CONFIG_KEYS)}")
        loras.append((None, str(entry["path"]), float(entry.get("strength", 1.0)), entry.get("name")))
    return loras
