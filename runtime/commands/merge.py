"""``lorabind merge --model DIR --lora [COMPONENT=]FILE[:STRENGTH] [--lora ...] --out DIR [--dtype ...]``.

Writes a complete diffusers folder with the LoRA(s) fused into its denoiser components (both Wan2.2 experts in
one run), without loading the model; the engine (meta-device build, shard streaming) lives in ``loaders.merging``. Module-level imports stay
light: ``lorabind --help`` must not import torch.
"""

from __future__ import annotations

import json
import sys

from . import DTYPE_ARGUMENTS

EXIT_REFUSED = 1


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="source diffusers model folder (read only)")
    parser.add_argument("--lora", required=True, action="append", metavar="[COMPONENT=]FILE[:STRENGTH]",
                        help="LoRA file or PEFT folder, optionally with the component it goes into and a strength "
                             "(default 1.0); repeatable, e.g. --lora transformer=HIGH.safetensors --lora "
                             "transformer_2=LOW.safetensors bakes a Wan2.2 pair in one run")
    parser.add_argument("--component", default=None, metavar="NAME",
                        help="component for --lora values that name none (default: the model's main denoiser, "
                             "e.g. transformer; Wan2.2 low-noise: transformer_2)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="new model folder to write (a new path or an empty folder; never inside --model or "
                             "a LoRA)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out that an earlier merge wrote (only once the new folder is "
                             "complete); any other existing path is refused")
    parser.add_argument("--asset-mode", choices=("copy", "symlink", "hardlink"), default="copy",
                        help="how files the merge does not change reach --out (default copy; symlink/hardlink "
                             "save the space of text encoders and VAE)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_ARGUMENTS), default=None,
                        help="dtype of the merged component's tensors (default: as stored in the source)")
    parser.add_argument("--lenient", action="store_true",
                        help="ignore LoRA keys that match nothing in the model (reported) instead of refusing")


def parse_lora_argument(value: str, default_component: str) -> tuple[str, str, float]:
    """``[COMPONENT=]FILE[:STRENGTH]`` -> (component, file, strength). The ``COMPONENT=`` prefix counts only when
    it names a component-like word (no path separator); the last ``:`` part is a strength only when it parses as
    a number."""
    component, sep, rest = value.partition("=")
    if not sep or "/" in component or "\\" in component or not component:
        component, rest = default_component, value
    path, sep, tail = rest.rpartition(":")
    if sep:
        try:
            return component, path, float(tail)
        except ValueError:
            pass
    return component, rest, 1.0


def run(args) -> int:
    import torch

    from ...loaders.errors import LoraBindError
    from ...loaders.merging import merge_into_folder

    try:
        report = merge_into_folder(args.model, [parse_lora_argument(v, args.component) for v in args.lora],
                                   args.out, lenient=args.lenient, asset_mode=args.asset_mode,
                                   overwrite=args.overwrite,
                                   dtype=getattr(torch, DTYPE_ARGUMENTS[args.dtype]) if args.dtype else None)
    except LoraBindError as exc:
        print(f"lorabind merge: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:  # e.g. a full disk: the half-written folder is already gone
        print(f"lorabind merge: failed, nothing written to {args.out}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"lorabind merge: wrote {args.out}")
    print(json.dumps(report, indent=2))
    return 0
