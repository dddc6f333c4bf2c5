"""Parallel vs sequential loading of a sharded diffusers transformer folder (``parallel_load_speedup``).

The folder is the Wan2.1-1.3B transformer configuration (30 blocks, dim 1536, ffn 8960, bf16) with random
weights, split into shards the way ``save_pretrained(max_shard_size=...)`` splits a real checkpoint; ``quick``
keeps the layout (shards + index) at a tiny width. The two sides load the same folder alternately in one process
(warm page cache on both), so the ratio measures the shard thread pool, not the disk.

When the loader's rule (``parallel_loading.auto_workers``) picks one worker for this folder (a rotating disk),
"parallel" IS the sequential loader: the figure is then the ratio of medians of identical runs, interleaved with
every other pair reversed and more repetitions, reported with ``same_path`` so it reads as what it is — the goal
(never slower than sequential) holds by construction, and the figure shows the noise around 1.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import torch
from safetensors.torch import save_file

from lorabind.loaders.models.parallel_loading import auto_workers, shard_loading
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
    """``workers`` None: the count the loader picks on its own for this folder (``auto_workers``)."""
    from diffusers import WanTransformer3DModel

    folder = os.path.join(tmp, "wan21_1_3b_transformer")
    config, shard_bytes = (QUICK, 64 << 10) if quick else (WAN21_1_3B, 256 << 20)
    shards = write_sharded_folder(folder, config, shard_bytes)
    workers = auto_workers(folder) if workers is None else workers

    def load(parallel: int):
        with shard_loading(parallel), quiet_library_progress():
            model = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16)
        return model

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
            "same_path": workers <= 1}
