"""``lorabind extract --base DIR --tuned DIR --rank R [--alpha A] --out FILE [--component NAME]``.

Extracts a LoRA (SVD per linear layer, full diffs for the rest) from the difference between two diffusers
folders of the same architecture; the logic lives in ``loaders.extraction``. Module-level imports stay light:
``lorabind --help`` must not import torch.
"""

from __future__ import annotations

import json
import os
import sys

from . import DTYPE_ARGUMENTS

EXIT_REFUSED = 1


def add_arguments(parser) -> None:
    parser.add_argument("--base", required=True, metavar="DIR", help="the base diffusers model folder")
    parser.add_argument("--tuned", required=True, metavar="DIR", help="the tuned (e.g. merged) diffusers model folder")
    parser.add_argument("--rank", required=True, type=int, metavar="R",
                        help="LoRA rank per linear layer (capped at min(out, in) of each layer)")
    parser.add_argument("--alpha", type=float, default=None, metavar="A",
                        help="write this alpha for every pair (scale alpha/rank); default: no alpha (scale 1)")
    parser.add_argument("--out", required=True, metavar="FILE", help="output .safetensors file")
    parser.add_argument("--component", default="transformer", metavar="NAME",
                        help="denoiser component folder to compare (default: transformer)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_ARGUMENTS), default=None,
                        help="dtype of the written tensors (default: the tuned model's dtype per tensor)")


def run(args) -> int:
    from ...loaders.errors import LoraBindError

    if not args.out.endswith(".safetensors"):
        print(f"lorabind extract: refused: --out {args.out} must end in .safetensors", file=sys.stderr)
        return EXIT_REFUSED
    try:
        summary = extract_to_file(args.base, args.tuned, args.out, rank=args.rank, alpha=args.alpha,
                                  component=args.component, dtype=args.dtype)
    except LoraBindError as exc:
        print(f"lorabind extract: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"lorabind extract: wrote {args.out}")
    print(json.dumps(summary, indent=2))
    return 0


def extract_to_file(base_dir: str, tuned_dir: str, out: str, *, rank: int, alpha=None,
                    component: str = "transformer", dtype=None) -> dict:
    import torch

    from ...loaders.extraction import ComponentWeights, extract_lora, save_safetensors_atomically

    base = ComponentWeights(base_dir, component)
    tuned = ComponentWeights(tuned_dir, component)
    result = extract_lora(base, tuned, rank=rank, alpha=alpha,
                          dtype=getattr(torch, DTYPE_ARGUMENTS[dtype]) if dtype else None)
    metadata = {"format": "lorabind-extract", "base": os.path.basename(os.path.abspath(base_dir)),
                "tuned": os.path.basename(os.path.abspath(tuned_dir)), "component": component,
                "extract_rank": str(rank)}  # not "rank"/"alpha": readers treat those as scaling metadata
    if alpha is not None:
        metadata["extract_alpha"] = str(alpha)
    save_safetensors_atomically(result.tensors, out, metadata)
    return result.summary()
