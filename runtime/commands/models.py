"""``lorabind models build-tiny``: (re)build the built-in offline tiny models and fixture LoRAs.

Module-level imports stay light (the CLI's ``--help`` must not load torch); the builders load inside ``run``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_MODELS_ROOT = "./models"
DEFAULT_INPUT_DIR = "./input"  # the default of `lorabind run --input` and `lorabind serve --input`


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    build = sub.add_parser(
        "build-tiny",
        help="build the built-in tiny models (random weights, offline, deterministic) under MODELS/diffusers",
        description="Build the built-in tiny models (random weights, offline, deterministic). Without --only, "
        "also the MiniMax-H3 tiny models, the synthetic fixture LoRAs and the example input images "
        "(INPUT/lorabind-tiny/start.png, end.png).",
    )
    build.add_argument("--models", metavar="DIR", default=None,
                       help=f"models root (default: $LORABIND_MODELS or {DEFAULT_MODELS_ROOT})")
    build.add_argument("--input", metavar="DIR", default=DEFAULT_INPUT_DIR,
                       help=f"input folder for the example images (default {DEFAULT_INPUT_DIR})")
    build.add_argument("--only", metavar="NAME", nargs="+", default=None,
                       help="build only these models (e.g. tiny-wan22-t2v)")


def run(args) -> int:
    if getattr(args, "models_command", None) != "build-tiny":
        print("usage: lorabind models build-tiny [--models DIR] [--only NAME ...]", file=sys.stderr)
        return 2
    models_root = Path(args.models or os.environ.get("LORABIND_MODELS") or DEFAULT_MODELS_ROOT)
    from ...loaders.errors import LoraBindError
    from ...loaders.tiny_models import BUILTIN_NAMES, build_tiny, unavailable_builtins

    if args.only:
        unknown = sorted(set(args.only) - set(BUILTIN_NAMES))
        if unknown:
            print(f"lorabind models build-tiny: unknown model(s) {', '.join(unknown)}; "
                  f"known: {', '.join(BUILTIN_NAMES)}", file=sys.stderr)
            return 2
    try:
        written = build_tiny(models_root, args.only, input_dir=None if args.only else args.input)
    except LoraBindError as exc:  # a library too old, or a folder in the way that no build wrote
        print(f"lorabind models build-tiny: {exc}", file=sys.stderr)
        return 1
    if not args.only:
        for name, why in unavailable_builtins().items():
            print(f"skipped {name}: {why}")
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} item(s) under {models_root.resolve()}")
    return 0
