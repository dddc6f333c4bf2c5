"""`lorabind plan MODEL --vram GIB [--ram GIB] [--weights W] [--memory PLAN] [--json]`, `lorabind plan MODEL --device cpu
--ram GIB`, or `lorabind plan --files FILE... --vram GIB ...`: what fits a machine, without loading weights.

For MODEL (a shipped configuration name, wan2.2-t2v-a14b ..., or a diffusers folder) every storage of the weights
(bf16, fp8 as ComfyUI's fp8 single files, each GGUF type for the denoisers) is planned under every memory plan;
what fits is listed fastest first with the files to get (``loaders.placement.choices``), then the fastest in
detail. ``--weights``/``--memory`` narrow the candidates to the file or plan you have. When nothing fits, the
smallest machine that would is named, checked by planning it. ``--device cpu --ram GIB`` plans a machine
without a GPU (everything in RAM). ``--files`` plans the single files named (a denoiser or an expert pair, the
VAE, the text encoder) from their headers. ``--parallel`` (or the serving guide's flags, as ``lorabind run``
reads them) plans one rank of a job that splits the model: ``--vram`` is each rank's device, ``--ram`` the
machine's host memory the ranks share (``loaders.models.parallel_plan``).
Exits 1 when nothing fits, so scripts can check before starting a long job, and 2 for bad input (a memory
amount that is not a finite positive number of GiB, a model folder that cannot be read or is too large to be
real), so a script never mistakes one for the other.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

EXIT_DOES_NOT_FIT = 1
MAX_GIB = float(1 << 20)  # a mebi-GiB (1 PiB): far above any machine, far below where byte counts overflow
MEMORY_CHOICES = ("auto", "full", "swap_experts", "offload_model", "offload_blocks")  # loaders.placement.MEMORY_PLANS
WEIGHTS = ("bf16", "fp8", "q8_0", "q6_k", "q5_k", "q5_0", "q4_k", "q4_0")  # loaders.placement.sizes.WEIGHTS


def add_arguments(parser) -> None:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..parallel.options import add_parallel_arguments

    parser.add_argument("model", metavar="MODEL", nargs="?",
                        help="a diffusers model folder, or a shipped configuration: wan2.1-t2v-1.3b, wan2.1-t2v-14b, "
                             "wan2.2-t2v-a14b, wan2.2-i2v-a14b, wan2.2-ti2v-5b, qwen-image, minimax-h3 (or the "
                             "repository id it is typed from: Wan-AI/Wan2.2-T2V-A14B-Diffusers, Qwen/Qwen-Image ...)")
    parser.add_argument("--vram", type=gib_amount, metavar="GIB", help="free device memory in GiB")
    parser.add_argument("--ram", type=gib_amount, metavar="GIB",
                        help="free host memory in GiB (unchecked when absent; with --device cpu, all there is)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a machine without a GPU, everything in --ram (default: cuda)")
    parser.add_argument("--memory", choices=MEMORY_CHOICES, default="auto",
                        help="only this memory plan (default: auto, every plan)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="dtype the model runs in (default: bfloat16)")
    parser.add_argument("--weights", choices=WEIGHTS, default=None,
                        help="only this storage of MODEL's weights: bf16, fp8 as ComfyUI's *_fp8_e4m3fn* single files, "
                             "or a GGUF quantization of the denoisers (q8_0, q6_k, q5_k, q5_0, q4_k, q4_0: the "
                             "published *-Q4_K_M.gguf files are mostly q4_k) beside bf16 text encoders (default: try "
                             "every one)")
    parser.add_argument("--files", metavar="FILE", nargs="+", default=(),
                        help="plan these single files instead of MODEL (denoiser(s), VAE, text encoder), read from "
                             "their headers")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_parallel_arguments(parser)


def gib_amount(text: str) -> float:
    """A memory amount in GiB: finite, positive and at most ``MAX_GIB``; anything else is an argparse error (exit
    2, the status for bad input) instead of a crash with the "does not fit" status."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB") from None
    if not (math.isfinite(value) and 0 < value <= MAX_GIB):
        raise argparse.ArgumentTypeError(f"{text!r} GiB: give a finite positive amount of at most {MAX_GIB:g} GiB")
    return value


def run(args) -> int:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.placement.choices import rank_choices
    from ...loaders.placement.model_plan import format_ranking, ranking_to_json
    from ...loaders.placement.published import model_of
    from ..parallel.options import parallel_spec, refusal

    usage = _usage_error(args)
    if usage:
        print(f"lorabind plan: {usage}", file=sys.stderr)
        return 2
    if args.model and not os.path.exists(args.model):  # a repository id names the configuration typed from it
        args.model = model_of(args.model) or args.model
    try:
        spec = parallel_spec(args)
        if refusal(spec):
            raise LoraBindError(f"--parallel {spec.describe()}: {refusal(spec)}")
        if spec.is_parallel or args.files:
            return _run_one(args, spec)
        ranking = rank_choices(args.model, vram_gib=args.vram, ram_gib=args.ram, device=args.device,
                               dtype=args.dtype, weights=args.weights, memory=args.memory)
    except LoraBindError as exc:
        print(f"lorabind plan: {exc}", file=sys.stderr)
        return 2
    # the model named in the answer: `lorabind models download --plan-json` gets its files
    print(json.dumps({"model": args.model, **ranking_to_json(ranking)}, indent=2) if args.json
          else format_ranking(args.model, ranking))
    return 0 if ranking.fitting else EXIT_DOES_NOT_FIT


def _usage_error(args) -> str:
    if bool(args.model) == bool(args.files):
        return "give either MODEL or --files FILE... (not both)"
    if args.device == "cpu":
        if args.ram is None or args.vram is not None:
            return "--device cpu plans RAM alone: give --ram GIB, not --vram"
        if args.files:
            return "--device cpu plans a MODEL (no --files)"
    elif args.vram is None:
        return "give --vram GIB (free device memory), or --device cpu --ram GIB for a machine without a GPU"
    return ""


def _run_one(args, spec) -> int:
    """``--files`` (the storage the files have) or ``--parallel``: one plan, as before the ranking."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.models.single_file.pipelines import files_sizes
    from ...loaders.placement.model_plan import format_plan, plan_model, plan_to_json, unchecked_host_line

    measured = files_sizes(tuple(args.files), args.dtype) if args.files else None
    if spec.is_parallel:
        return _run_parallel(args, spec, measured)
    plan, sizes = plan_model(args.model, vram_gib=args.vram, ram_gib=args.ram, memory=args.memory,
                             dtype=args.dtype, weights=args.weights or "bf16", sizes=measured)
    print(json.dumps(plan_to_json(plan, sizes), indent=2) if args.json
          else "\n".join(filter(None, [format_plan(plan, sizes), unchecked_host_line(args.ram)])))
    return 0 if plan.fits else EXIT_DOES_NOT_FIT


def _run_parallel(args, spec, measured) -> int:
    """One rank's plan for a job split as ``spec``: the spec and its division first, then the per-rank plan."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.models.parallel_plan import format_rank_lines, plan_ranks, rank_plan_to_json
    from ...loaders.placement.model_plan import format_plan, plan_to_json

    ranks = plan_ranks(args.model, spec, vram_gib=args.vram, ram_gib=args.ram, memory=args.memory,
                       dtype=args.dtype, weights=args.weights or "bf16", sizes=measured, device=args.device)
    if args.json:
        data = plan_to_json(ranks.plan, ranks.sizes)
        data["parallel"] = rank_plan_to_json(ranks)
        print(json.dumps(data, indent=2))
    else:
        print("\n".join([*format_rank_lines(ranks), format_plan(ranks.plan, ranks.sizes, cpu=args.device == "cpu")]))
    return 0 if ranks.fits else EXIT_DOES_NOT_FIT
