"""The flag names of the guides people come from, on our commands: accepted where they mean what ours mean,
refused in one line naming ours where they do not.

Why: people copy LightX2V's ``lora_merger.py`` / ``lora_extractor.py`` commands and vllm-omni's ``serve`` lines.
``merge`` and ``extract`` take the merger's and extractor's names as extra spellings of their own options (their
``add_arguments``; ``DTYPE_SPELLINGS`` reads ``--output-dtype bfloat16``); ``serve``'s three are here. A flag we
do not reproduce is parsed and refused by name, never ``unrecognized arguments`` and never silently ignored. No
torch import here: ``lorabind --help`` stays fast.
"""

from __future__ import annotations

from .device_options import apply_load_workers

# torch's dtype names (the guides' ``--output-dtype bfloat16``) -> ours
DTYPE_SPELLINGS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def dtype_name(value: str) -> str:
    """``--dtype`` / ``--output-dtype`` value in our spelling (``bfloat16`` -> ``bf16``); argparse's choices
    then check it."""
    return DTYPE_SPELLINGS.get(value, value)


def add_serve_guide_arguments(parser) -> None:
    """vllm-omni's serve flags."""
    parser.add_argument("--lora-scale", type=float, default=None, metavar="S",
                        help="vllm-omni's scale of the --lora-path files: only 1 is taken (distill files are fused "
                             "at the strength their contract is trained for; a request sets its adapter's scale "
                             "with lora.scale)")
    # vllm-omni's --num-weight-load-threads N is an alias of --load-workers N (device_options, on run and serve)
    parser.add_argument("--disable-multithread-weight-load", action="store_true",
                        help="load weight files one at a time (the same as --load-workers 1)")


def apply_serve_guide_arguments(args) -> str | None:
    """Apply (or refuse, in one line naming ours) the guide flags ``serve`` was given; an error text or None."""
    if args.lora_scale is not None and args.lora_scale != 1.0:
        return (f"--lora-scale {args.lora_scale:g}: not supported; --lora-path distill files are fused at strength "
                "1 (what their contract is trained for), and a request sets its adapter's scale with lora.scale")
    if args.disable_multithread_weight_load:
        if args.load_workers not in (None, 1):
            return (f"--disable-multithread-weight-load and --load-workers (--num-weight-load-threads) "
                    f"{args.load_workers} contradict each other")
        return apply_load_workers(1)
    return None
