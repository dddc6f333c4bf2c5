"""The flag names of the guides people come from, on our commands: accepted where they mean what ours mean,
refused in one line naming ours where they do not.

Why: people copy LightX2V's ``lora_merger.py`` / ``lora_extractor.py`` commands and vllm-omni's ``serve`` lines.
``merge`` and ``extract`` take the merger's and extractor's names as extra spellings of their own options (their
``add_arguments``; ``DTYPE_SPELLINGS`` reads ``--output-dtype bfloat16``); ``serve``'s three are here. A flag we
do not reproduce is parsed and refused by name, never ``unrecognized arguments`` and never silently ignored. No
torch import here: ``lorabind --help`` stays fast.
"""

from __future__ import annotations

import os

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
    parser.add_argument("--num-weight-load-threads", type=int, default=None, metavar="N",
                        help="threads loading a sharded model's weight files (sets $LORABIND_LOAD_WORKERS; "
                             "default: one per core, 1 on a rotating disk)")
    parser.add_argument("--disable-multithread-weight-load", action="store_true",
                        help="load weight files one at a time (the same as --num-weight-load-threads 1)")


def apply_serve_guide_arguments(args) -> str | None:
    """Apply (or refuse, in one line naming ours) the guide flags ``serve`` was given; an error text or None."""
    if args.lora_scale is not None and args.lora_scale != 1.0:
        return (f"--lora-scale {args.lora_scale:g}: not supported; --lora-path distill files are fused at strength "
                "1 (what their contract is trained for), and a request sets its adapter's scale with lora.scale")
    threads = args.num_weight_load_threads
    if args.disable_multithread_weight_load:
        if threads not in (None, 1):
            return f"--disable-multithread-weight-load and --num-weight-load-threads {threads} contradict each other"
        threads = 1
    if threads is not None:
        if threads < 1:
            return "--num-weight-load-threads must be at least 1"
        # lazy: the CLI's parser imports this module; the engine loads when it runs
        from ..loaders.models.diffusers_folder import LOAD_WORKERS_VARIABLE

        os.environ[LOAD_WORKERS_VARIABLE] = str(threads)  # read by every model load of this process
    return None
