"""A warm reload of a sharded diffusers transformer folder with the loader rule's worker count against 1 worker
(``parallel_load_speedup``), saying which count the rule chose and why.

The folder is the Wan2.1-1.3B transformer configuration (30 blocks, dim 1536, ffn 8960, bf16) with random
weights, split into shards the way ``save_pretrained(max_shard_size=...)`` splits a real checkpoint; ``quick``
keeps the layout (shards + index) at a tiny width. It is loaded once before the rule is asked (a reload: the
shards are in the page cache), then the two sides load it alternately in one process, so the ratio measures the
shard thread pool, not the disk. On a disk that reports itself rotating (a cloud VM's virtio disk) the rule now
sees the cached shards and takes threads (issue 44).

When the rule (``parallel_loading.worker_rule``) picks one worker for this folder, "parallel" IS the sequential
loader: the figure is then the ratio of medians of identical runs, interleaved with every other pair reversed and
more repetitions, reported with ``same_path`` so it reads as what it is — the goal (never slower than sequential)
holds by construction, and the figure shows the noise around 1.

Alone: ``python -m bench.bench_parallel_load [--quick] [--reps N] [--workers N]`` prints the rule's choice and
the two medians.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Optional

import torch
from safetensors.torch import save_file

from lorabind.loaders.models.parallel_loading import shard_loading, worker_rule
from lorabind.loaders.models.store import quiet_library_progress

from .measure import alternate, alternate_balanced, timed

# Repetitions when the rule picks one worker: both sides then run the same sequential loader, so the ratio of
# medians is only noise around 1; more interleaved runs (every other pair in reversed order) keep it close to 1.
SAME_PATH_REPS = 9

# Wan2.1-T2V-1.3B's transformer/config.json values (the published Wan-AI/Wan2.1-T2V-1.3B-Diffusers config).
WAN21_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                  out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                  qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
QUICK = dict(WAN21_1_3B, num_attention_heads=4, attention_head_dim=16, text_dim=64, ffn_dim=128, num_layers=4)
WEIGHTS_NAME = "diffusion_pytorch_model"


def write_sharded_folder(folder: str, config: dict, shard_bytes: int, seed: int = 0) -> int:
    """A diffusers model folder (config.json + ``…-0000N-of-0000M.safetensors`` + index) with random bf16 weights;
    returns the number of shards.

    Why not ``save_pretrained``: it needs the whole model materialised first (5.6 GB of fp32 for 1.3B parameters);
    here the shapes come from a meta-device build and each shard is generated and written on its own."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in WanTransformer3DModel(**config).state_dict().items()}
    groups, current, size = [], [], 0
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if current and size + nbytes > shard_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    groups.append(current)
    generator = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    os.makedirs(folder, exist_ok=True)
    for index, names in enumerate(groups, start=1):
        file = f"{WEIGHTS_NAME}-{index:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: (torch.randn(shapes[name], generator=generator) * 0.02).to(torch.bfloat16)
                   for name in names}
        save_file(tensors, os.path.join(folder, file), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file))
    with open(os.path.join(folder, f"{WEIGHTS_NAME}.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"_class_name": "WanTransformer3DModel", **config}, fh)
    return len(groups)


def run(tmp: str, quick: bool, reps: int, workers: Optional[int] = None) -> dict:
    """``workers`` None: the count the loader picks on its own for this folder (``worker_rule``), after a first
    load (what it picks for a reload)."""
    from diffusers import WanTransformer3DModel

    folder = os.path.join(tmp, "wan21_1_3b_transformer")
    config, shard_bytes = (QUICK, 64 << 10) if quick else (WAN21_1_3B, 256 << 20)
    shards = write_sharded_folder(folder, config, shard_bytes)

    def load(parallel: int):
        with shard_loading(parallel), quiet_library_progress():
            model = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16)
        return model

    load(1)  # the first load: what follows is a reload
    workers, rule = worker_rule(folder) if workers is None else (workers, f"{workers} worker(s): --workers")

    loaded = {}
    sequential = lambda: timed(lambda: loaded.__setitem__("seq", load(1)))  # noqa: E731
    parallel = lambda: timed(lambda: loaded.__setitem__("par", load(workers)))  # noqa: E731
    if workers > 1:
        pair = alternate("sequential", sequential, f"parallel ({workers} workers)", parallel, reps)
    else:  # the rule chose the sequential loader: the figure is the noise of identical runs, measured as such
        pair = alternate_balanced("sequential", sequential, "auto (the rule picked 1 worker: sequential too)",
                                  parallel, max(reps, SAME_PATH_REPS))
    same = all(torch.equal(a, b) for a, b in zip(loaded["seq"].state_dict().values(),
                                                  loaded["par"].state_dict().values()))
    parameters = sum(p.numel() for p in loaded["seq"].parameters())
    return {"pair": pair, "shards": shards, "parameters": parameters, "workers": workers, "same_weights": same,
            "same_path": workers <= 1, "rule": rule}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny-width layout (seconds, not minutes)")
    parser.add_argument("--reps", type=int, default=5, help="timed loads per side (default 5)")
    parser.add_argument("--workers", type=int, default=None, help="threads instead of the rule's choice")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lorabind-bench-load-") as tmp:
        result = run(tmp, args.quick, args.reps, workers=args.workers)
    pair = result["pair"]
    print(f"rule: {result['rule']}")
    print(f"{result['parameters'] / 1e6:.1f} M parameters in {result['shards']} shards, median seconds: "
          f"{pair.name_a} {pair.a:.3f}, {pair.name_b} {pair.b:.3f} (speed-up {pair.ratio:.2f}x, same weights "
          f"{result['same_weights']})")
    print(json.dumps({"workers": result["workers"], "rule": result["rule"], "sequential_s": pair.a,
                      "chosen_s": pair.b, "parallel_load_speedup": pair.ratio, "shards": result["shards"],
                      "same_weights": result["same_weights"], "load_average": [round(x, 2) for x in os.getloadavg()]}))
    return 0


if __name__ == "__main__":
    from bench import bench_parallel_load

    sys.exit(bench_parallel_load.main())
