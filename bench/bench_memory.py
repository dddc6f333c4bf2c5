"""Peak extra memory of one lorabind fuse, in a fresh process (so no earlier run's freed memory hides it).

Budget = backups of every tensor the fuse patches (kept for the bit-exact restore) + the largest patched layer
(in its own dtype). Run as ``python -m bench.bench_memory SIZE LORA_PATH``; prints one JSON object.
"""

from __future__ import annotations

import gc
import json
import sys

import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.families import family_by_id
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import map_to_model, read_lora
from lorabind.loaders.models.store import LoadedModel

from .measure import PeakRSS
from .workload import FULL, QUICK, build_transformer


def measure(size, lora_path: str) -> dict:
    transformer = build_transformer(size)
    model = LoadedModel(path="<bench>", name="bench", family="wan2.1", pipeline=None,
                        components={"transformer": transformer})
    targets = map_to_model(read_lora(lora_path), "wan2.1", family_by_id("wan2.1")).targets
    modules = dict(transformer.named_modules())
    backup = largest = 0
    for module_path, target in targets.items():
        module = modules[module_path]
        backup += module.weight.numel() * module.weight.element_size()
        if "bias" in target.param_diffs and module.bias is not None:
            backup += module.bias.numel() * module.bias.element_size()
        largest = max(largest, module.weight.numel() * module.weight.element_size())
    for target in targets.values():  # fault the file's pages in first: we measure the fuse, not the read
        if target.low_rank is not None:
            target.low_rank.up.sum(), target.low_rank.down.sum()
    gc.collect()
    with PeakRSS() as peak:
        binding.bind(model, [FuseSpec(lora_path, 1.0, "transformer", "bench")], [])
    budget = backup + largest
    return {"peak_extra_bytes": peak.extra, "peak_budget_bytes": budget, "peak_mem_ratio": peak.extra / budget}


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    size = {"full": FULL, "quick": QUICK}[sys.argv[1]]
    print(json.dumps(measure(size, sys.argv[2])))
