"""Parallelism's price and gain: one denoiser step split by Ulysses against the same step unsplit, and what one
tensor-parallel rank holds against one whole process.

    python bench/bench_parallel.py [--quick]            # CPU: ulysses_2rank_vs_1rank
    python bench/bench_parallel.py --device cuda         # GPUs: ulysses_speedup_<N>gpu for every usable N >= 2
    python bench/bench_parallel.py --memory [--quick]    # CPU: tp2_rank_peak_vs_one_process (cuda: 2 GPUs)

**CPU** (``ulysses_2rank_vs_1rank``): one forward of a tiny-config Wan transformer sized so attention dominates (many
tokens, few blocks, a narrow FFN), split by ``ulysses=2`` over two gloo ranks of 1 thread each, through the engine's
own ``loaders.distributed.context_parallel.apply_sequence_parallel``; against the same forward unsplit in one rank
with 2 threads. Both sides use the machine's two cores for the same arithmetic, so the figure (2-rank time / 1-rank
time) is what the collectives cost (the all-to-alls around every attention, the gather of the output) net of how
much better two processes scale than two threads. Good is close to 1: the split then costs nothing on a machine
where it cannot gain anything; below 1, the split ranks do the same work faster than one process's two threads.
A CPU machine has no memory or speed to win from a split; the figure exists so that a change making the collectives
dearer shows up. It has no goal.

**GPU** (``--device cuda``): ``ulysses_speedup_<N>gpu`` = one forward on one GPU / the same forward split over N GPUs
(nccl), for every N in 2, 4, 8 that the machine has and that divides the heads: a few blocks of the real Wan2.2
A14B configuration (bf16) on an 81-frame 720p latent. It needs at least 2 GPUs and skips cleanly otherwise (not run
yet: the machines lent to the project have had one GPU at most).

Measurement: every rank is a fresh spawned process (as ``tests/helpers/gloo_ranks.py`` starts them: spawn, not
fork, so no thread pool or process group is inherited). Inside one job, rank 0 times the unsplit forward (A, the
other ranks waiting at a barrier) and then, with every rank, the split one (B), alternately, after a warm-up, each
timed between two barriers; the figure is rank 0's median B over its median A. On CPU rank 0 also times the unsplit
forward on 1 thread (``one_rank_one_thread_ms``): on a loaded 2-core machine one process's second thread can make a
forward slower, not faster (its OpenMP barriers wait on a preempted thread), and the figure then reads far below 1;
the 1-thread time shows whether that happened (ideal: two_ranks_ms about half of it). The job also reports the
largest difference between the split and unsplit outputs (0.0 expected: Ulysses moves heads, never reorders a sum).

**Tensor parallelism's memory** (``--memory``, issue 58; ``tp2_rank_peak_vs_one_process``, goal <= 0.65): a Wan
pipeline written at bench time with every file bf16 (nothing cast on either side): the transformer at Wan2.1-1.3B
(30 blocks) and at one Wan2.2 A14B expert's width with 4 of its 40 blocks, the real Wan2.1 VAE and a small UMT5 at
the transformer's text width (the point is the denoiser), and a rank-64 LoRA in the published layout. One whole
process and each rank of a tp=2 job (fresh processes, 1 thread each: the figure is memory, not speed) run the
same phases through the use cases: load, encode, fuse the LoRA, one denoiser step, decode one 64x64 frame. Each
phase's peak is VmHWM (reset at its start through /proc/self/clear_refs), with the private RssAnon after it; on a GPU
``max_memory_allocated``. The figure is the largest rank's peak over every phase / one process's. Beside it: the
runtime before any weight (Python, torch, diffusers, the engine; the same in every process), what stays whole on every
rank (``plan --parallel``'s ``whole_on_every_rank``), and plan's per-rank weights against what the rank held above
the runtime (planned for this run's frame size; its working-memory reserve, sized for real resolutions, is shown
apart: a 64x64 frame needs little of it).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.multiprocessing as mp

if __package__ in (None, ""):  # run as a script: import this file as `bench.bench_parallel`, so spawned ranks can
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # unpickle its functions

from bench.workload import QUICK, WorkloadSize  # noqa: E402  (after the path above)

RANK_TIMEOUT_S = 300  # a collective that waits longer fails the rank instead of hanging the bench
# Tiny Wan blocks: 4 heads of 32 (dim 128), FFN 256, so attention over the latent's tokens is most of the work.
TINY_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=16, out_channels=16,
                text_dim=64, freq_dim=64, ffn_dim=256, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
CPU_FULL = dict(config=TINY_WAN, latent=(1, 16, 4, 64, 64), text_tokens=32)  # 4096 tokens
CPU_QUICK = dict(config=dict(TINY_WAN, num_layers=1), latent=(1, 16, 2, 32, 32), text_tokens=16)  # 512 tokens
GPU_BLOCKS = 4  # of the A14B configuration's 40: every block costs the same, so a few give the per-step ratio
GPU_LATENT = (1, 16, 21, 90, 160)  # 81 frames at 720p after the VAE: 75,600 tokens
GPU_COUNTS = (2, 4, 8)


def _forward_inputs(case: dict, device: torch.device, dtype: torch.dtype) -> dict:
    generator = torch.Generator().manual_seed(1)  # the same inputs on every rank
    text_dim = case["config"]["text_dim"]
    return {"hidden_states": torch.randn(case["latent"], generator=generator).to(device, dtype),
            "timestep": torch.tensor([500.0], device=device),
            "encoder_hidden_states": torch.randn(1, case["text_tokens"], text_dim, generator=generator)
            .to(device, dtype), "return_dict": False}


def _build(config: dict, device: torch.device, dtype: torch.dtype):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)  # the same weights on every rank
    model = WanTransformer3DModel(**config).to(device)
    if dtype != torch.float32:
        model = model.to(dtype)
    return model.eval().requires_grad_(False)


def _timed_forward(model, inputs: dict, device: torch.device, barrier: bool) -> float:
    import torch.distributed as dist

    if barrier:
        dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        model(**inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if barrier:
        dist.barrier()
    return time.perf_counter() - start


def _rank_job(rank: int, world_size: int, case: dict, device_type: str, reps: int, unsplit_threads: int) -> dict:
    """One rank: rank 0 alone runs the unsplit model (A), then every rank the Ulysses-split one (B), alternately."""
    import torch.distributed as dist

    from lorabind.loaders.distributed import process_group
    from lorabind.loaders.distributed.context_parallel import apply_sequence_parallel
    from lorabind.loaders.distributed.spec import parse_parallel

    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    if device_type == "cuda":
        torch.cuda.set_device(device)
    process_group.join_job(parse_parallel(f"ulysses={world_size}"), device_type, timeout_s=RANK_TIMEOUT_S)
    split = _build(case["config"], device, dtype)
    unsplit = copy.deepcopy(split) if rank == 0 else None
    apply_sequence_parallel({"transformer": split}, device)
    inputs = _forward_inputs(case, device, dtype)
    times_a, times_b, times_one_thread = [], [], []
    for _ in range(reps + 1):  # the first round is the warm-up
        if rank == 0:
            torch.set_num_threads(unsplit_threads)
            times_a.append(_timed_forward(unsplit, inputs, device, barrier=False))
            if device.type == "cpu":  # how well one process's threads scale here: it reads the figure
                torch.set_num_threads(1)
                times_one_thread.append(_timed_forward(unsplit, inputs, device, barrier=False))
        dist.barrier()  # the other ranks wait here while rank 0 runs A
        torch.set_num_threads(1)
        times_b.append(_timed_forward(split, inputs, device, barrier=True))
    difference = None
    if rank == 0:
        with torch.no_grad():
            difference = (split(**inputs)[0].float() - unsplit(**inputs)[0].float()).abs().max().item()
    else:
        with torch.no_grad():
            split(**inputs)  # the split forward is collective: every rank runs it
    process_group.finish_job()  # a barrier first (a rank that tore its group down early died with SIGABRT once)
    return {"unsplit_s": statistics.median(times_a[1:]) if rank == 0 else None,
            "unsplit_one_thread_s": statistics.median(times_one_thread[1:]) if times_one_thread else None,
            "split_s": statistics.median(times_b[1:]), "max_abs_diff": difference}


def _rank_main(rank: int, world_size: int, port: int, out_dir: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    result = _rank_job(rank, world_size, *args)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


def _run_job(world_size: int, case: dict, device_type: str, reps: int, unsplit_threads: int) -> dict:
    """Spawn the ranks of one job and return rank 0's result (a failing rank raises with its traceback)."""
    from lorabind.runtime.parallel.launch import free_port

    with tempfile.TemporaryDirectory(prefix="lorabind-bench-parallel-") as out_dir:
        mp.start_processes(_rank_main, args=(world_size, free_port(), out_dir,
                                             (case, device_type, reps, unsplit_threads)),
                           nprocs=world_size, join=True, start_method="spawn")
        return json.loads((Path(out_dir) / "rank0.json").read_text())


def run(quick: bool, reps: int) -> dict:
    """The CPU figure: 2 ranks x 1 thread (ulysses=2) vs 1 rank x 2 threads."""
    case = CPU_QUICK if quick else CPU_FULL
    result = _run_job(2, case, "cpu", reps, unsplit_threads=2)
    latent = case["latent"]
    tokens = latent[2] * (latent[3] // 2) * (latent[4] // 2)
    return {"ulysses_2rank_vs_1rank": result["split_s"] / result["unsplit_s"], "one_rank_ms": result["unsplit_s"] * 1e3,
            "two_ranks_ms": result["split_s"] * 1e3, "one_rank_one_thread_ms": result["unsplit_one_thread_s"] * 1e3, "max_abs_diff": result["max_abs_diff"], "tokens": tokens,
            "blocks": case["config"]["num_layers"]}


def run_device(reps: int = 5) -> dict:
    """The GPU figures (``ulysses_speedup_<N>gpu``); empty, with a line saying why, without 2 CUDA devices."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        print(f"bench_parallel: ulysses speed-up needs at least 2 CUDA devices, this machine has {count}; skipped")
        return {}
    from lorabind.loaders.io.shipped_configs import shipped_model_folder

    config = json.loads((shipped_model_folder("wan2.2-t2v-a14b") / "transformer" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    case = dict(config=dict(config, num_layers=GPU_BLOCKS), latent=GPU_LATENT, text_tokens=512)
    figures = {}
    for gpus in (n for n in GPU_COUNTS if n <= count and config["num_attention_heads"] % n == 0):
        result = _run_job(gpus, case, "cuda", reps, unsplit_threads=torch.get_num_threads())
        figures[f"ulysses_speedup_{gpus}gpu"] = result["unsplit_s"] / result["split_s"]
        print(f"ulysses={gpus}: 1 GPU {result['unsplit_s'] * 1e3:.1f} ms, {gpus} GPUs {result['split_s'] * 1e3:.1f} "
              f"ms, speed-up {figures[f'ulysses_speedup_{gpus}gpu']:.2f}x, max abs diff {result['max_abs_diff']:.3g}")
    return figures


# ---------------------------------------------------------------------------------------------------------------
# Tensor parallelism's memory (issue 58): what one tp=2 rank holds against one whole process, phase by phase.

TP_LORA = "bench_tp_rank64.safetensors"  # no step count in the name: no contract, so one step may run
A14B_BLOCKS = 4  # of an A14B expert's 40: each block is 0.65 GiB of split linears, the rest stays the same


@dataclass(frozen=True)
class MemoryCase:
    """A Wan pipeline written at bench time: the transformer at ``size`` (``bench.workload``, random bf16), the
    real Wan2.1 VAE (``real_vae``, bf16 as ComfyUI publishes it; else the tiny one) and a small UMT5 at the
    transformer's text width (one layer, 4 heads, FFN 256: the point is the denoiser); one ``width`` x ``height``
    frame, one step."""

    label: str
    size: WorkloadSize
    real_vae: bool
    width: int = 64
    height: int = 64


def tp_cases(quick: bool) -> dict:
    """{name: MemoryCase}: Wan2.1-1.3B at its real depth, and one Wan2.2 A14B expert's width with a few of its
    40 blocks (``--quick``: the bench's tiny width alone)."""
    from .bench_real_size import WAN21_1_3B

    if quick:
        return {"quick": MemoryCase("quick width, 2 blocks", QUICK, real_vae=False, width=32, height=32)}
    a14b = WorkloadSize(dim=5120, heads=40, ffn=13824, text_dim=4096, layers=A14B_BLOCKS, rank=64)
    return {"1.3b": MemoryCase("Wan2.1-1.3B, 30 blocks", WAN21_1_3B, real_vae=True),
            "a14b_expert": MemoryCase(f"a Wan2.2 A14B expert's width, {A14B_BLOCKS} of 40 blocks", a14b,
                                      real_vae=True)}


def write_memory_model(directory: str, case: MemoryCase) -> tuple[str, str]:
    """(diffusers folder, LoRA file) of ``case`` under ``directory``: every file bf16, so nothing is cast on
    either side and the plan (``--dtype bfloat16``) sizes what is stored."""
    from diffusers import AutoencoderKLWan, WanPipeline

    from lorabind.loaders.models.store import quiet_library_progress
    from lorabind.tiny_models.tokenizers import build_umt5_style_tokenizer
    from lorabind.tiny_models.wan import tiny_vae, unipc_scheduler

    from .bench_text_encoding import UMT5_XXL, build_umt5
    from .workload import build_transformer, building_in, write_published_lora

    tokenizer = build_umt5_style_tokenizer()
    torch.manual_seed(0)
    encoder = build_umt5(len(tokenizer), num_layers=1, **{**UMT5_XXL, "d_model": case.size.text_dim, "d_ff": 256,
                                                          "num_heads": 4})
    with building_in(torch.bfloat16):
        vae = AutoencoderKLWan() if case.real_vae else tiny_vae()
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=encoder, vae=vae, scheduler=unipc_scheduler(),
                           transformer=build_transformer(case.size, seed=1))
    folder = os.path.join(directory, "model")
    with quiet_library_progress():
        pipeline.save_pretrained(folder, safe_serialization=True)
    del pipeline, encoder, vae
    return folder, write_published_lora(os.path.join(directory, TP_LORA), case.size, seed=11)


def _memory_now() -> dict:
    """This process's resident memory now (``VmRSS``, of it ``RssAnon``: private, not a file's pages) and its
    peak since the last ``_reset_peak`` (``VmHWM``), in bytes, from /proc/self/status."""
    fields = {"VmHWM": "peak", "VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    found = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in fields:
                found[fields[name]] = int(value.split()[0]) * 1024
    return found


def _reset_peak() -> None:
    """Start a new high-water mark (``VmHWM`` := ``VmRSS``), so each phase's peak is its own."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


class _Phases:
    """Each phase's peak and what stays after it: ``mark(name)`` closes the phase running since the last mark."""

    def __init__(self, device: torch.device):
        self.device, self.phases = device, {}
        self.mark("runtime")  # Python, torch, diffusers and the engine imported; no weight read yet

    def mark(self, name: str) -> None:
        entry = _memory_now()
        if self.device.type == "cuda":
            entry["cuda_peak"] = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.phases[name] = entry
        _reset_peak()


def _memory_job(rank: int, world_size: int, folder: str, lora: str, case: MemoryCase, device_type: str) -> dict:
    """One process of the comparison: load the model, encode, bind the LoRA (rank 64, published layout: every
    block linear), one denoiser step, decode; each phase's peak. Under ``world_size`` 2 it is a tp=2 rank."""
    from lorabind.usecases.verbs import attach_fuse, decode, empty_latent, encode_text, load_model, sample
    from lorabind.usecases.vocabulary import SampleOptions

    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    phases = _Phases(device)
    handle = load_model(Path(folder), name="bench-tp-memory", dtype="bfloat16", device=str(device))
    phases.mark("load")
    loaded = handle.model
    positive, negative = encode_text(loaded, "a cat dancing on a street, video"), encode_text(loaded, "")
    phases.mark("encode")
    bound = attach_fuse(handle, TP_LORA, lora, 1.0, where="bench_parallel").handle
    latent = empty_latent(loaded, case.width, case.height, 1)
    done = {}

    def bind_progress(index: int, total: int) -> None:
        if index == total:
            phases.mark("bind")
            done["bind"] = True

    samples, _, report = sample(bound, positive, negative, latent,
                                SampleOptions(seed=1, steps=1, cfg=1.0, shift=5.0), on_bind=bind_progress)
    phases.mark("first step")
    decode(loaded, samples)
    phases.mark("decode")
    return {"phases": phases.phases, "restore_sources": report["bind"]["restore_sources"],
            "tensor_parallel": report["tensor_parallel"], "bound_in_phase": bool(done)}


def _memory_rank_main(rank: int, world_size: int, port: int, out_dir: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)  # both sides alike: the figure is memory, not speed
    # the runtime's share, imported before the first mark: the engine, and the library classes it builds
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel  # noqa: F401
    from transformers import UMT5EncoderModel  # noqa: F401

    from lorabind.loaders.distributed import process_group
    from lorabind.loaders.distributed.spec import parse_parallel
    from lorabind.usecases import verbs  # noqa: F401

    if world_size > 1:
        device_type = args[-1]
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        process_group.join_job(parse_parallel(f"tp={world_size}"), device_type, timeout_s=RANK_TIMEOUT_S)
    result = _memory_job(rank, world_size, *args)
    if world_size > 1:
        process_group.finish_job()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


def measure_processes(world_size: int, folder: str, lora: str, case: MemoryCase, device_type: str = "cpu") -> list:
    """``_memory_job`` in ``world_size`` fresh processes (1: one whole process; 2: a tp=2 job), each rank's result."""
    from lorabind.runtime.parallel.launch import free_port

    with tempfile.TemporaryDirectory(prefix="lorabind-bench-tp-memory-") as out_dir:
        mp.start_processes(_memory_rank_main, args=(world_size, free_port(), out_dir,
                                                    (folder, lora, case, device_type)),
                           nprocs=world_size, join=True, start_method="spawn")
        return [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world_size)]


def peak(result: dict, key: str = "peak") -> int:
    """A process's largest phase peak (``peak``: VmHWM; ``cuda_peak``: max_memory_allocated)."""
    return max(entry.get(key, 0) for name, entry in result["phases"].items() if name != "runtime")


def _plan_figures(folder: str, case: MemoryCase, device_type: str) -> dict:
    """``plan --parallel``'s per-rank figure for tp=2 and for one process, for this run's frame size: on the CPU
    the RAM a rank needs (``plan --device cpu``), on a GPU its device memory."""
    from lorabind.loaders.distributed.spec import ParallelSpec
    from lorabind.loaders.models.parallel_plan import plan_ranks, whole_on_every_rank

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    vram = torch.cuda.get_device_properties(0).total_memory / 2**30 if device_type == "cuda" else None
    plans = {degree: plan_ranks(folder, ParallelSpec(tp=degree), vram_gib=vram,
                                ram_gib=ram, device=device_type, dtype="bfloat16",
                                decode_size=(case.width, case.height)) for degree in (1, 2)}
    return {"plan_rank_bytes": plans[2].plan.peak_device_bytes, "plan_one_bytes": plans[1].plan.peak_device_bytes,
            "plan_rank_weights_bytes": sum(size.bytes for size in plans[2].sizes),
            "plan_one_weights_bytes": sum(size.bytes for size in plans[1].sizes),
            "whole_on_every_rank_bytes": whole_on_every_rank(plans[2]),
            "split_bytes": sum(share.sharded_bytes for share in plans[2].shares)}


def memory_case(case: MemoryCase, device_type: str = "cpu") -> dict:
    """One case: the model written, one whole process and a tp=2 job measured, plan's figures beside them."""
    with tempfile.TemporaryDirectory(prefix="lorabind-bench-tp-model-") as directory:
        folder, lora = write_memory_model(directory, case)
        one = measure_processes(1, folder, lora, case, device_type)[0]
        ranks = measure_processes(2, folder, lora, case, device_type)
        planned = _plan_figures(folder, case, device_type)
    key = "cuda_peak" if device_type == "cuda" else "peak"
    rank_peak, one_peak = max(peak(r, key) for r in ranks), peak(one, key)
    result = {"label": case.label, "one_process": one, "ranks": ranks, "rank_peak_bytes": rank_peak,
              "one_process_peak_bytes": one_peak, "rank_peak_vs_one_process": rank_peak / one_peak,
              "rank_anon_vs_one_process": max(peak(r, "anon") for r in ranks) / peak(one, "anon"),
              "runtime_bytes": one["phases"]["runtime"]["rss"], **planned}
    held = max(peak(r, key) - r["phases"]["runtime"]["rss"] for r in ranks)  # above the runtime, every rank alike
    result["rank_held_bytes"] = held
    result["plan_vs_measured"] = result["plan_rank_weights_bytes"] / held
    return result


def run_memory(quick: bool, device_type: str = "cpu") -> dict:
    """``tp2_rank_peak_vs_one_process`` (the first case's) and every case's figures."""
    cases = {name: memory_case(case, device_type) for name, case in tp_cases(quick).items()}
    return {"tp2_rank_peak_vs_one_process": next(iter(cases.values()))["rank_peak_vs_one_process"], "cases": cases}


def memory_summary(result: dict) -> dict:
    """Each case's figures for ``run_all --json`` (the phases per process, without the per-tensor details)."""
    keep = ("label", "rank_peak_bytes", "one_process_peak_bytes", "rank_peak_vs_one_process", "rank_anon_vs_one_process",
            "runtime_bytes", "rank_held_bytes", "plan_rank_bytes", "plan_one_bytes", "plan_rank_weights_bytes",
            "plan_vs_measured", "whole_on_every_rank_bytes", "split_bytes")
    return {name: {**{k: case[k] for k in keep}, "phases": {"one_process": case["one_process"]["phases"],
                                                             **{f"rank{r}": v["phases"] for r, v in
                                                                enumerate(case["ranks"])}},
                   "restore_sources": [r["restore_sources"] for r in case["ranks"]]}
            for name, case in result["cases"].items()}


def print_memory(result: dict) -> None:
    """Each case's phases, per process, then the figures."""
    gib = 2**30
    for case in result["cases"].values():
        print(f"\ntensor parallelism's memory, {case['label']} (GiB; peak VmHWM per phase, private RssAnon after it)")
        processes = [("one process", case["one_process"])] + [(f"tp=2 rank {r}", v) for r, v in
                                                                enumerate(case["ranks"])]
        phases = list(case["one_process"]["phases"])
        print(f"  {'':14}" + "".join(f"{p:>18}" for p in phases))
        for label, measured in processes:
            print(f"  {label:14}" + "".join(f"{e['peak'] / gib:>9.2f} ({e['anon'] / gib:5.2f})"
                                            for e in measured["phases"].values()))
        whole = ", ".join(f"{k} {v / gib:.2f}" for k, v in case["whole_on_every_rank_bytes"].items())
        print(f"  rank peak / one process: {case['rank_peak_vs_one_process']:.3f} (private memory: "
              f"{case['rank_anon_vs_one_process']:.3f}); the runtime before any weight: "
              f"{case['runtime_bytes'] / gib:.2f}")
        print(f"  plan per rank: {case['plan_rank_weights_bytes'] / gib:.2f} of weights against "
              f"{case['rank_held_bytes'] / gib:.2f} held above the runtime ({case['plan_vs_measured']:.2f}x); with "
              f"its working-memory reserve {case['plan_rank_bytes'] / gib:.2f}; whole on every rank: {whole}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions (smoke mode)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: the speed-up per GPU count")
    parser.add_argument("--memory", action="store_true", help="only tensor parallelism's memory: a tp=2 rank's "
                        "peak against one process's, phase by phase (on cuda: max_memory_allocated, 2 GPUs)")
    args = parser.parse_args(argv)
    reps = 2 if args.quick else 5
    if args.memory:
        if args.device != "cpu" and torch.cuda.device_count() < 2:
            print(f"bench_parallel --memory: tp=2 needs 2 CUDA devices, this machine has {torch.cuda.device_count()}")
            return 0
        result = run_memory(args.quick, "cuda" if args.device != "cpu" else "cpu")
        print_memory(result)
        print(json.dumps({"tp2_rank_peak_vs_one_process": result["tp2_rank_peak_vs_one_process"]}))
        return 0
    if args.device != "cpu":
        print(json.dumps(run_device(reps)))
        return 0
    result = run(args.quick, reps)
    print(json.dumps(dict(result, load_average=[round(x, 2) for x in os.getloadavg()])))
    return 0


if __name__ == "__main__":
    from bench import bench_parallel

    sys.exit(bench_parallel.main())
