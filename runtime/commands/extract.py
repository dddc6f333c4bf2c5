"""``lorabind extract --base DIR|FILE --tuned DIR|FILE --out FILE [--rank R] [--layers GLOB ...] [--config FILE]``.

Extracts a LoRA (SVD per linear layer, full diffs for the rest unless ``--no-diffs``) from the difference between
two models of the same architecture: diffusers folders (one component compared), ComfyUI single denoiser files
(bf16 or fp8, any saver's key prefix; ``loaders.offline.single_file_weights``), or one of each. The logic lives
in ``loaders.offline.extraction``. The options follow LightX2V's extractor: layer globs, rank 32 cut per layer,
alpha = rank, bf16 output, device, key prefix, and a JSON or YAML config holding any of them, in our names or the
extractor's (``loaders.offline.tool_config``; command-line values win). A contract baked into the tuned model by
``lorabind merge`` travels into the extracted file. Module-level imports stay light: ``lorabind --help`` must not
import torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..guide_flags import add_format_arguments, dtype_name, format_refusal
from . import DTYPE_ARGUMENTS

EXIT_REFUSED = 1
DEFAULTS = {"rank": 32, "alpha": "rank", "dtype": "bf16", "layers": [], "diffs": True,
            "key_prefix": "transformer.", "device": "cpu"}
PATH_KEYS = {"base": "--base", "tuned": "--tuned", "out": "--out"}
CONFIG_KEYS = (*DEFAULTS, *PATH_KEYS, "component", "overwrite")


def add_arguments(parser) -> None:
    parser.add_argument("--base", "--source-model", dest="base", metavar="DIR|FILE",
                        help="the base model: a diffusers folder or a single denoiser .safetensors file")
    parser.add_argument("--tuned", "--target-model", dest="tuned", metavar="DIR|FILE",
                        help="the tuned (e.g. merged) model: a diffusers folder or a single denoiser file")
    parser.add_argument("--out", "--output", dest="out", metavar="FILE",
                        help="output .safetensors file (a new file; never inside --base or --tuned)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out that an earlier extract wrote; any other file is refused")
    parser.add_argument("--component", default=None, metavar="NAME",
                        help="folders: the denoiser component to compare (default: the model's main denoiser, "
                             "e.g. transformer; a single file is the component it holds)")
    add_format_arguments(parser, ("--source-type", "--target-type", "--output-format"))
    parser.add_argument("--config", metavar="FILE",
                        help="JSON or YAML file with any of the settings above (base, tuned, out, layers, rank, "
                             "alpha, dtype, diffs, key_prefix, device, ...) or LightX2V's extractor keys "
                             "(source_model, target_model, output, rank, output_dtype); keys lorabind does not "
                             "reproduce are refused by name; command-line values win")
    parser.add_argument("--rank", type=int, default=None, metavar="R",
                        help="LoRA rank per linear layer, cut at min(out, in) of each layer (default 32)")
    parser.add_argument("--alpha", type=float, default=None, metavar="A",
                        help="alpha written for every pair (scale alpha/rank; default: the rank)")
    parser.add_argument("--no-alpha", action="store_true", help="write no alpha (readers use scale 1)")
    parser.add_argument("--layers", nargs="+", default=None, metavar="GLOB",
                        help="only linears whose module name matches a glob, e.g. 'blocks.*.attn1.*' "
                             "(default: every linear)")
    parser.add_argument("--dtype", "--output-dtype", dest="dtype", type=dtype_name,
                        choices=sorted(DTYPE_ARGUMENTS) + ["auto"], default=None,
                        help="dtype of the written tensors (default bf16; auto: the tuned model's per tensor)")
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="where the SVDs run: cpu (default), cuda, cuda:N, mps or auto")
    parser.add_argument("--key-prefix", default=None, metavar="PREFIX",
                        help="prefix of every written key (default 'transformer.'; '' for bare module names; "
                             "auto: the tuned model's own, e.g. a single file's 'model.diffusion_model.'; a name "
                             "without its dot gets one)")
    parser.add_argument("--diffs", action=argparse.BooleanOptionalAction, default=None,
                        help="also store changed biases, norms and other non-linear tensors whole "
                             "(default on; --no-diffs writes low-rank pairs only, like LightX2V)")


def _settings(args) -> dict:
    """Built-in defaults, overridden by the config file (ours or LightX2V's names), overridden by explicit
    command-line values; ``LoraBindError`` naming the first path that neither gives."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.offline.tool_config import EXTRACT_ALIASES, read_config, translate

    settings = dict(DEFAULTS)
    if args.config:
        settings.update(translate(read_config(args.config), args.config, CONFIG_KEYS, EXTRACT_ALIASES))
    explicit = {"rank": args.rank, "alpha": args.alpha, "dtype": args.dtype, "layers": args.layers,
                "diffs": args.diffs, "key_prefix": args.key_prefix, "device": args.device, "base": args.base,
                "tuned": args.tuned, "out": args.out, "component": args.component,
                "overwrite": args.overwrite or None}
    settings.update({key: value for key, value in explicit.items() if value is not None})
    if args.no_alpha:
        settings["alpha"] = None
    for key, flag in PATH_KEYS.items():
        if not settings.get(key):
            raise LoraBindError(f"give {flag} (on the command line or in --config)")
    if not str(settings["out"]).endswith(".safetensors"):
        raise LoraBindError(f"--out {settings['out']} must end in .safetensors")
    return settings


def run(args) -> int:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError

    out = args.out
    refused = format_refusal(args)
    if refused:
        print(f"lorabind extract: refused: {refused}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        settings = _settings(args)
        out = str(settings.pop("out"))
        summary = extract_to_file(str(settings.pop("base")), str(settings.pop("tuned")), out, **settings)
    except LoraBindError as exc:
        print(f"lorabind extract: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:  # e.g. a full disk: the temporary file is already gone
        print(f"lorabind extract: failed, nothing written to {out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"lorabind extract: wrote {out}")
    print(json.dumps(summary, indent=2))
    return 0


def extract_to_file(base: str, tuned: str, out: str, *, component: str | None = None, rank: int = 32,
                    alpha="rank", dtype="bf16", layers=(), diffs: bool = True, key_prefix: str = "transformer.",
                    device: str = "cpu", overwrite: bool = False) -> dict:
    """Extract ``tuned - base`` (folders, single files or one of each) into ``out``; the summary as a dict."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.io.safe_output import check_output
    from ...loaders.offline.extraction import extract_lora, save_extracted

    options = _options(rank, alpha, dtype, layers, diffs, key_prefix, device)
    inputs = (base, tuned)
    check_output(out, kind="file", inputs=inputs, overwrite=overwrite)  # before anything is read
    base_weights, tuned_weights, component = _readers(base, tuned, component)
    result = extract_lora(base_weights, tuned_weights, options)
    metadata = {"format": "lorabind-extract", "base": os.path.basename(os.path.abspath(base)),
                "tuned": os.path.basename(os.path.abspath(tuned)), "component": component,
                "extract_rank": str(options.rank)}  # not "rank"/"alpha": readers treat those as scaling metadata
    if options.alpha is not None:
        metadata["extract_alpha"] = str(options.alpha)
    if options.layers:
        metadata["extract_layers"] = json.dumps(list(options.layers))
    metadata.update(_baked_contract(tuned, component))
    save_extracted(result.tensors, out, metadata, inputs=inputs, overwrite=overwrite)
    return result.summary()


def _options(rank, alpha, dtype, layers, diffs, key_prefix, device):
    """``ExtractOptions`` from the settings; a ``dtype`` may also be spelled as torch does (LightX2V's
    ``output_dtype: bfloat16``)."""
    import torch

    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.offline.extraction import ExtractOptions
    from ...loaders.placement.devices import resolve_device

    spelled = {torch_name: short for short, torch_name in DTYPE_ARGUMENTS.items()}
    dtype = spelled.get(dtype, dtype)
    if dtype not in (None, "auto") and dtype not in DTYPE_ARGUMENTS:
        raise LoraBindError(f"dtype must be one of {sorted(DTYPE_ARGUMENTS)} or auto, got {dtype!r}")
    try:
        rank, alpha = int(rank), float(rank) if alpha == "rank" else (None if alpha is None else float(alpha))
    except (TypeError, ValueError):
        raise LoraBindError(f"rank must be a whole number and alpha a number, got rank {rank!r}, alpha "
                            f"{alpha!r}") from None
    return ExtractOptions(
        rank=rank, alpha=alpha, dtype=getattr(torch, DTYPE_ARGUMENTS[dtype]) if dtype not in (None, "auto") else None,
        layers=(layers,) if isinstance(layers, str) else tuple(layers or ()), diffs=bool(diffs),
        key_prefix=str(key_prefix), device=str(resolve_device(device)))


def _readers(base: str, tuned: str, component: str | None) -> tuple:
    """(base weights, tuned weights, component name): a single file is read as the component it holds, a folder's
    component is ``component``, else the file's beside it, else the folder's main denoiser."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.io.model_index import read_model_index
    from ...loaders.models.single_file.shard_folders import is_shard_folder
    from ...loaders.models.store import denoiser_names
    from ...loaders.offline.component_folders import diffusers_named_weights
    from ...loaders.offline.extraction import ComponentWeights
    from ...loaders.offline.single_file_weights import SingleFileWeights

    for flag, path in (("--base", base), ("--tuned", tuned)):
        if not os.path.exists(path):
            raise LoraBindError(f"{flag} {path}: no such model folder or file")
    # a file or a folder of shards without model_index.json (LightX2V's high_noise_model/, a lone transformer/)
    files = {path: diffusers_named_weights(path) or SingleFileWeights(path) for path in (base, tuned)
             if os.path.isfile(path) or is_shard_folder(path)}
    if len(files) == 2 and component:
        raise LoraBindError(f"--component {component} chooses a folder's component; a single file is the one "
                            "component it holds")
    folders = [path for path in (base, tuned) if path not in files]
    component = component or (next(iter(files.values())).component if files else
                              denoiser_names(read_model_index(folders[0]))[0])
    readers = [files[path] if path in files else ComponentWeights(path, component) for path in (base, tuned)]
    return readers[0], readers[1], component


def _baked_contract(tuned: str, component: str) -> dict:
    """The ``sampling_contract`` metadata of what ``merge`` baked into the tuned folder's component or file."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.contracts.baked import INDEX_KEY, extracted_contract_metadata
    from ...loaders.io.model_index import read_model_index
    from ...loaders.models.single_file.baked_files import baked_file_record
    from ...loaders.models.single_file.shard_folders import is_shard_folder

    if os.path.isfile(tuned):  # a merged file is one component: everything baked into it counts
        return extracted_contract_metadata({INDEX_KEY: baked_file_record(tuned)}, None)
    if is_shard_folder(tuned):  # a release's own shards: merge writes files, so nothing is baked in
        return {}
    return extracted_contract_metadata(read_model_index(tuned), component)
