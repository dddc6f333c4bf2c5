"""PEFT activation switch: time to switch between two cached dynamic adapters, and proof that no base weight
was written (every base parameter keeps its in-place version counter and its exact values)."""

from __future__ import annotations

import os
import statistics

import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.handles import AdapterSpec
from lorabind.loaders.models.store import LoadedModel

from .measure import timed
from .workload import FULL, QUICK, build_transformer, write_lora


def _switch_ms(size, workdir: str, reps: int) -> tuple[float, bool]:
    paths = [write_lora(os.path.join(workdir, f"peft_{size.dim}_{tag}.safetensors"), size, seed, bias_diffs=False)
             for tag, seed in (("a", 3), ("b", 4))]
    transformer = build_transformer(size)
    base = {name: (param, param._version, param.detach().clone()) for name, param in transformer.named_parameters()}
    model = LoadedModel(path="<bench>", name="bench", family="wan2.1", pipeline=None,
                        components={"transformer": transformer})
    specs = [AdapterSpec(path=p, scale=1.0, name=os.path.basename(p)) for p in paths]
    for spec in specs:  # load + inject both once: the switch below is between cached adapters
        binding.bind(model, [], [spec])
    times = []
    for i in range(2 * reps + 2):
        elapsed = timed(lambda spec=specs[i % 2]: binding.bind(model, [], [spec]))
        if i >= 2:  # first two are warm-up
            times.append(elapsed)
    binding.bind(model, [], [])
    untouched = all(param._version == version and torch.equal(param, original)
                    for param, version, original in base.values())
    binding.release_adapters(model)
    return statistics.median(times) * 1000, untouched


def run(size, workdir: str, reps: int) -> dict:
    sizes = [QUICK] if size is QUICK else [QUICK, FULL]
    results = {}
    untouched_all = True
    for s in sizes:
        label = "tiny" if s is QUICK else "1.3B-width"
        ms, untouched = _switch_ms(s, workdir, reps)
        results[f"switch_ms_{label}"] = round(ms, 3)
        untouched_all = untouched_all and untouched
    return {"switch_ms": results[f"switch_ms_{'tiny' if size is QUICK else '1.3B-width'}"], **results,
            "base_weights_untouched": untouched_all}
