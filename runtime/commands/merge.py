"""``lorabind merge --model DIR --lora FILE[:STRENGTH] [--lora ...] [--component NAME] --out DIR [--dtype ...]``.

Writes a complete diffusers folder with the LoRA(s) fused into one denoiser component, without loading the
model; the engine (meta-device build, shard streaming) lives in ``loaders.merging``. Module-level imports stay
light: ``lorabind --help`` must not import torch.
"""

from __future__ import annotations

import json
import sys

from . import DTYPE_ARGUMENTS

EXIT_REFUSED = 1


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="source diffusers model folder (read only)")
    parser.add_argument("--lora", required=True, action="append", metavar="FILE[:STRENGTH]",
                        help="LoRA file or PEFT folder, optionally with a strength (default 1.0); repeatable")
    parser.add_argument("--component", default="transformer", metavar="NAME",
                        help="denoiser component to fuse into (default: transformer; Wan2.2 low-noise: "
                             "transformer_2)")
    parser.add_argument("--out", required=True, metavar="DIR", help="new model folder to write (must not exist)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_ARGUMENTS), default=None,
                        help="dtype of the merged component's tensors (default: as stored in the source)")
    parser.add_argument("--lenient", action="store_true",
                        help="ignore LoRA keys that match nothing in the model (reported) instead of refusing")


def parse_lora_argument(value: str) -> tuple[str, float]:
    """``FILE[:STRENGTH]``: the last ``:`` part is a strength only when it parses as a number."""
    path, sep, tail = value.rpartition(":")
    if sep:
        try:
            return path, float(tail)
        except ValueError:
            pass
    return value, 1.0


def run(args) -> int:
    import torch

    from ...loaders.errors import LoraBindError
    from ...loaders.merging import merge_into_folder

    try:
        report = merge_into_folder(args.model, [parse_lora_argument(v) for v in args.lora], args.out,
                                   component=args.component, lenient=args.lenient,
                                   dtype=getattr(torch, DTYPE_ARGUMENTS[args.dtype]) if args.dtype else None)
    except (LoraBindError, FileExistsError) as exc:
        print(f"lorabind merge: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"lorabind merge: wrote {args.out}")
    print(json.dumps(report, indent=2))
    return 0
