"""Sequence parallelism's price and gain: one denoiser step split by Ulysses against the same step unsplit.

    python bench/bench_parallel.py [--quick]            # CPU: ulysses_2rank_vs_1rank
    python bench/bench_parallel.py --device cuda         # GPUs: ulysses_speedup_<N>gpu for every usable N >= 2

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
from pathlib import Path

import torch
import torch.multiprocessing as mp

if __package__ in (None, ""):  # run as a script: import this file as `bench.bench_parallel`, so spawned ranks can
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # unpickle its functions

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions (smoke mode)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: the speed-up per GPU count")
    args = parser.parse_args(argv)
    reps = 2 if args.quick else 5
    if args.device != "cpu":
        print(json.dumps(run_device(reps)))
        return 0
    result = run(args.quick, reps)
    print(json.dumps(dict(result, load_average=[round(x, 2) for x in os.getloadavg()])))
    return 0


if __name__ == "__main__":
    from bench import bench_parallel

    sys.exit(bench_parallel.main())
