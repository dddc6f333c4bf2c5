"""``lorabind extract --base DIR --tuned DIR --out FILE [--rank R] [--layers GLOB ...] [--config FILE] ...``.

Extracts a LoRA (SVD per linear layer, full diffs for the rest unless ``--no-diffs``) from the difference between
two diffusers folders of the same architecture; the logic lives in ``loaders.offline.extraction``. The options follow
LightX2V's extractor: layer globs, rank 32 cut per layer, alpha = rank, bf16 output, device, key prefix, and a
JSON config file holding any of them (command-line values win). Module-level imports stay light: ``lorabind
--help`` must not import torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import DTYPE_ARGUMENTS

EXIT_REFUSED = 1
DEFAULTS = {"rank": 32, "alpha": "rank", "dtype": "bf16", "layers": [], "diffs": True,
            "key_prefix": "transformer.", "device": "cpu"}


def add_arguments(parser) -> None:
    parser.add_argument("--base", required=True, metavar="DIR", help="the base diffusers model folder")
    parser.add_argument("--tuned", required=True, metavar="DIR", help="the tuned (e.g. merged) diffusers model folder")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="output .safetensors file (a new file; never inside --base or --tuned)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out that an earlier extract wrote; any other file is refused")
    parser.add_argument("--component", default=None, metavar="NAME",
                        help="denoiser component folder to compare (default: the model's main denoiser, e.g. "
                             "transformer)")
    parser.add_argument("--config", metavar="FILE",
                        help="JSON file with any of: layers, rank, alpha, dtype, diffs, key_prefix, device "
                             "(LightX2V's extractor options; command-line values win)")
    parser.add_argument("--rank", type=int, default=None, metavar="R",
                        help="LoRA rank per linear layer, cut at min(out, in) of each layer (default 32)")
    parser.add_argument("--alpha", type=float, default=None, metavar="A",
                        help="alpha written for every pair (scale alpha/rank; default: the rank)")
    parser.add_argument("--no-alpha", action="store_true", help="write no alpha (readers use scale 1)")
    parser.add_argument("--layers", nargs="+", default=None, metavar="GLOB",
                        help="only linears whose module name matches a glob, e.g. 'blocks.*.attn1.*' "
                             "(default: every linear)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_ARGUMENTS) + ["auto"], default=None,
                        help="dtype of the written tensors (default bf16; auto: the tuned model's per tensor)")
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="where the SVDs run: cpu (default), cuda, cuda:N, mps or auto")
    parser.add_argument("--key-prefix", default=None, metavar="PREFIX",
                        help="prefix of every written key (default 'transformer.'; '' for bare module names)")
    parser.add_argument("--diffs", action=argparse.BooleanOptionalAction, default=None,
                        help="also store changed biases, norms and other non-linear tensors whole "
                             "(default on; --no-diffs writes low-rank pairs only, like LightX2V)")


def _settings(args) -> dict:
    """Built-in defaults, overridden by the config file, overridden by explicit command-line values."""
    from ...loaders.io import json_limits
    from ...loaders.errors import LoraBindError

    settings = dict(DEFAULTS)
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as handle:
                config = json_limits.load(handle)
        except (OSError, ValueError) as exc:
            raise LoraBindError(f"--config {args.config}: cannot be read ({exc})") from None
        unknown = sorted(set(config) - set(DEFAULTS)) if isinstance(config, dict) else ["(not an object)"]
        if unknown:
            raise LoraBindError(f"--config {args.config}: unknown keys {unknown}; known: {sorted(DEFAULTS)}")
        settings.update(config)
    explicit = {"rank": args.rank, "alpha": args.alpha, "dtype": args.dtype, "layers": args.layers,
                "diffs": args.diffs, "key_prefix": args.key_prefix, "device": args.device}
    settings.update({key: value for key, value in explicit.items() if value is not None})
    if args.no_alpha:
        settings["alpha"] = None
    return settings


def run(args) -> int:
    from ...loaders.errors import LoraBindError

    if not args.out.endswith(".safetensors"):
        print(f"lorabind extract: refused: --out {args.out} must end in .safetensors", file=sys.stderr)
        return EXIT_REFUSED
    try:
        summary = extract_to_file(args.base, args.tuned, args.out, component=args.component,
                                  overwrite=args.overwrite, **_settings(args))
    except LoraBindError as exc:
        print(f"lorabind extract: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:  # e.g. a full disk: the temporary file is already gone
        print(f"lorabind extract: failed, nothing written to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"lorabind extract: wrote {args.out}")
    print(json.dumps(summary, indent=2))
    return 0


def extract_to_file(base_dir: str, tuned_dir: str, out: str, *, component: str | None = None, rank: int = 32,
                    alpha="rank", dtype="bf16", layers=(), diffs: bool = True, key_prefix: str = "transformer.",
                    device: str = "cpu", overwrite: bool = False) -> dict:
    import torch

    from ...loaders.contracts.baked import extracted_contract_metadata
    from ...loaders.placement.devices import resolve_device
    from ...loaders.offline.extraction import ComponentWeights, ExtractOptions, extract_lora, save_extracted
    from ...loaders.models.model_index import read_model_index
    from ...loaders.models.store import denoiser_names
    from ...loaders.io.safe_output import check_output

    if dtype not in (None, "auto") and dtype not in DTYPE_ARGUMENTS:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_ARGUMENTS)} or auto, got {dtype!r}")
    options = ExtractOptions(
        rank=int(rank), alpha=float(rank) if alpha == "rank" else (None if alpha is None else float(alpha)),
        dtype=getattr(torch, DTYPE_ARGUMENTS[dtype]) if dtype not in (None, "auto") else None,
        layers=tuple(layers or ()), diffs=bool(diffs), key_prefix=str(key_prefix),
        device=str(resolve_device(device)))
    inputs = (base_dir, tuned_dir)
    check_output(out, kind="file", inputs=inputs, overwrite=overwrite)  # before anything is read
    component = component or denoiser_names(read_model_index(base_dir))[0]
    base = ComponentWeights(base_dir, component)
    tuned = ComponentWeights(tuned_dir, component)
    result = extract_lora(base, tuned, options)
    metadata = {"format": "lorabind-extract", "base": os.path.basename(os.path.abspath(base_dir)),
                "tuned": os.path.basename(os.path.abspath(tuned_dir)), "component": component,
                "extract_rank": str(options.rank)}  # not "rank"/"alpha": readers treat those as scaling metadata
    if options.alpha is not None:
        metadata["extract_alpha"] = str(options.alpha)
    if options.layers:
        metadata["extract_layers"] = json.dumps(list(options.layers))
    metadata.update(extracted_contract_metadata(read_model_index(tuned_dir), component))
    save_extracted(result.tensors, out, metadata, inputs=inputs, overwrite=overwrite)
    return result.summary()
