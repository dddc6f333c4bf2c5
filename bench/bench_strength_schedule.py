"""Strength schedules: what one per-step strength change costs, next to the sampling step it sits between.

A schedule re-binds between steps: an adapter only changes its scale (no weight written), a fused LoRA re-patches
its own layers from their originals. Both are timed as a strength change 1.0 <-> 0.5 through ``bind`` (what the
sampler calls), and set beside one denoiser forward (a step at cfg 1) on the same workload transformer, as
ratios: change / step. The fused figure is the one that matters on large models: it grows with the LoRA's layers
while the step grows with the latent.
"""

from __future__ import annotations

import os
import statistics

import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.handles import AdapterSpec, FuseSpec
from lorabind.loaders.models.store import LoadedModel

from .measure import timed
from .workload import QUICK, build_transformer, write_lora

STRENGTHS = (1.0, 0.5)  # every bind below is a change


def _forward_inputs(size, frames: int, side: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {"hidden_states": torch.randn((1, 16, frames, side, side), generator=generator).bfloat16(),
            "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn((1, 64, size.text_dim), generator=generator).bfloat16(),
            "return_dict": False}


def _median_ms(action, reps: int) -> float:
    times = [timed(lambda i=i: action(i)) for i in range(2 * reps + 2)][2:]  # the first two warm up
    return statistics.median(times) * 1000


def run(size, workdir: str, reps: int) -> dict:
    # one purely low-rank file serves both sides: a fuse and a dynamic adapter of the same layers
    lora_path = write_lora(os.path.join(workdir, "schedule.safetensors"), size, seed=5, bias_diffs=False)
    transformer = build_transformer(size)
    model = LoadedModel(path="<bench>", name="bench", family="wan2.1", pipeline=None,
                        components={"transformer": transformer})
    inputs = _forward_inputs(size, 2, 16 if size is QUICK else 32)
    with torch.no_grad():
        step_ms = _median_ms(lambda i: transformer(**inputs), reps)
    fused_ms = _median_ms(lambda i: binding.bind(
        model, [FuseSpec(lora_path, STRENGTHS[i % 2], "transformer")], []), reps)
    binding.unbind(model)
    adapter_ms = _median_ms(lambda i: binding.bind(
        model, [], [AdapterSpec(lora_path, STRENGTHS[i % 2], "transformer")]), reps)
    binding.unbind(model)
    binding.release_adapters(model)
    return {"step_ms": step_ms, "fused_change_ms": fused_ms, "adapter_change_ms": adapter_ms,
            "strength_step_fused_vs_step": fused_ms / step_ms,
            "strength_step_adapter_vs_step": adapter_ms / step_ms}
