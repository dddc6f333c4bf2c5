"""`lorabind plan MODEL --vram GIB [--ram GIB] [--weights W] [--text-encoder E] [--memory PLAN] [--json]`,
`lorabind plan MODEL --device cpu --ram GIB`, or `lorabind plan --files FILE... --vram GIB ...`: what fits a
machine, without loading weights.

For MODEL (a shipped configuration name, wan2.2-t2v-a14b ..., or a diffusers folder) every storage of the weights
(bf16, fp8 as ComfyUI's fp8 single files, each GGUF type for the denoisers), paired with the bf16 or the fp8 text
encoder, is planned under every memory plan; what fits is listed fastest first with the files to get
(``loaders.placement.choices``), then the fastest in detail. ``--weights``/``--text-encoder``/``--memory`` narrow
the candidates to the files or plan you have. When nothing fits, the smallest machine that would is named,
checked by planning it. ``--vram``/``--ram`` are the machine's memory; the answer keeps and states headroom for
the CUDA context, the desktop and the OS as ComfyUI does (``loaders.placement.headroom``; ``--reserve-vram``
as ComfyUI's flag). The decode is planned at the model's native size (``--width/--height`` to change it).
``--device cpu --ram GIB`` plans a machine without a GPU (everything in RAM). ``--files`` plans the single files
named (a denoiser or an expert pair, the VAE, the text encoder) from their headers. ``--parallel`` (or the
serving guide's flags, as ``lorabind run`` reads them) plans one rank of a job that splits the model: ``--vram``
is each rank's device, ``--ram`` the machine's host memory the ranks share; ``ulysses``/``ring``/``cfg`` search
every storage as plain ``plan`` does, ``tp`` plans bf16 weights (``loaders.models.parallel_plan``).
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
TEXT_ENCODER_WEIGHTS = ("bf16", "fp8")  # loaders.placement.storages.TEXT_ENCODER_WEIGHTS
MAX_SIDE = 16384  # --width/--height: far above any model's frames


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
    parser.add_argument("--text-encoder", choices=TEXT_ENCODER_WEIGHTS, default=None, dest="text_encoder",
                        help="only this storage of the text encoder: bf16, or fp8 as ComfyUI's *_fp8_e4m3fn_scaled "
                             "files (default: try both)")
    parser.add_argument("--reserve-vram", type=reserve_amount, metavar="GIB", default=None, dest="reserve_vram",
                        help="device memory to keep for the desktop and other programs, as ComfyUI's flag "
                             "(default: ComfyUI's, 0.4 GiB on Linux, 0.6 GiB on Windows); the CUDA context's "
                             "0.5 GiB is kept besides")
    parser.add_argument("--width", type=side_amount, metavar="PIXELS", default=None,
                        help="plan the decode at this width (default: the model's native size)")
    parser.add_argument("--height", type=side_amount, metavar="PIXELS", default=None,
                        help="plan the decode at this height (default: the model's native size)")
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


def reserve_amount(text: str) -> float:
    """``--reserve-vram``: GiB, zero allowed (keep nothing besides the CUDA context)."""
    return 0.0 if text.strip() in ("0", "0.0") else gib_amount(text)


def side_amount(text: str) -> int:
    """A frame side in pixels: a whole number from 16 to ``MAX_SIDE``."""
    if not text.isdigit() or not 16 <= int(text) <= MAX_SIDE:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of pixels from 16 to {MAX_SIDE}")
    return int(text)


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
        if spec.tp > 1 or args.files:
            return _run_one(args, spec)
        ranking = rank_choices(args.model, machine(args, spec), dtype=args.dtype, weights=args.weights,
                               text_encoder=args.text_encoder, memory=args.memory)
    except LoraBindError as exc:
        print(f"lorabind plan: {exc}", file=sys.stderr)
        return 2
    if args.json:  # the model named in the answer: `lorabind models download --plan-json` gets its files
        data = {"model": args.model, **ranking_to_json(ranking)}
        if spec.is_parallel:
            data["parallel"] = _parallel_json(spec, ranking)
        print(json.dumps(data, indent=2))
    else:
        print("\n".join([*_parallel_lines(spec, ranking), format_ranking(args.model, ranking)]))
    return 0 if ranking.fitting else EXIT_DOES_NOT_FIT


def machine(args, spec=None):
    """The machine the flags state: memory, headroom, the ranks sharing the host and the decode size."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.placement.choices import Machine
    from ...loaders.placement.storages import decode_size

    decode, source = decode_size(args.model, args.width, args.height) if args.model else ((1280, 720, 81), "")
    ranks, sequence = (spec.world_size, spec.sequence) if spec is not None and spec.is_parallel else (1, 1)
    return Machine(device=args.device, vram_gib=args.vram, ram_gib=args.ram, reserve_vram_gib=args.reserve_vram,
                   ranks=ranks, sequence_split=sequence, decode=decode, decode_source=source)


def _parallel_lines(spec, ranking) -> list:
    """``ulysses``/``ring``/``cfg``: the split and what it does to each rank, above the ranking."""
    if not spec.is_parallel:
        return []
    return [f"parallel: {spec.describe()} ({spec.world_size} ranks on one machine, each holding the whole model; "
            f"device figures are per rank, host figures per rank and checked for all {spec.world_size} together)",
            f"working memory per rank: divided by {spec.sequence} (the ranks sharing each step's tokens)"]


def _parallel_json(spec, ranking) -> dict:
    """The ``parallel`` part of ``plan --json`` for a sequence or CFG split (``rank_plan_to_json``'s fields)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.placement.planner import default_activation_bytes

    return {"spec": {"ulysses": spec.ulysses, "ring": spec.ring, "cfg": spec.cfg, "tp": spec.tp,
                     "text": spec.describe()},
            "ranks": spec.world_size, "figures": "per rank", "host_checked_for_all_ranks": ranking.ram_gib is not None,
            "activation_bytes": default_activation_bytes(ranking.detail.sizes) // spec.sequence, "tensor_parallel": []}


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
    """``--files`` (the storage the files have) or ``--parallel tp=N``: one plan on the usable memory."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.models.single_file.pipelines import files_sizes
    from ...loaders.placement.headroom import GIB
    from ...loaders.placement.model_plan import format_plan, plan_model, plan_to_json, unchecked_host_line

    measured = files_sizes(tuple(args.files), args.dtype) if args.files else None
    stated = machine(args, spec)
    vram = stated.device_free / GIB
    ram = None if args.ram is None else stated.headroom.usable(args.ram, stated.headroom.host_bytes) / GIB
    headroom = stated.headroom.describe(args.device, args.ram is not None)
    if spec.is_parallel:
        return _run_parallel(args, spec, measured, vram, ram, headroom)
    plan, sizes = plan_model(args.model, vram_gib=vram, ram_gib=ram, memory=args.memory,
                             dtype=args.dtype, weights=args.weights or "bf16", sizes=measured,
                             decode_size=stated.decode)
    print(json.dumps({**plan_to_json(plan, sizes), "headroom": stated.headroom.to_json()}, indent=2) if args.json
          else "\n".join(filter(None, [headroom, format_plan(plan, sizes), unchecked_host_line(args.ram)])))
    return 0 if plan.fits else EXIT_DOES_NOT_FIT


def _run_parallel(args, spec, measured, vram: float, ram, headroom: str) -> int:
    """One rank's plan for a job split by ``tp`` (or for ``--files``): the spec and its division first, then the
    per-rank plan."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.models.parallel_plan import format_rank_lines, plan_ranks, rank_plan_to_json
    from ...loaders.placement.model_plan import format_plan, plan_to_json

    ranks = plan_ranks(args.model, spec, vram_gib=vram, ram_gib=ram, memory=args.memory,
                       dtype=args.dtype, weights=args.weights or "bf16", sizes=measured, device=args.device)
    if args.json:
        data = plan_to_json(ranks.plan, ranks.sizes)
        data["parallel"] = rank_plan_to_json(ranks)
        print(json.dumps(data, indent=2))
    else:
        print("\n".join([*format_rank_lines(ranks), headroom,
                          format_plan(ranks.plan, ranks.sizes, cpu=args.device == "cpu")]))
    return 0 if ranks.fits else EXIT_DOES_NOT_FIT
