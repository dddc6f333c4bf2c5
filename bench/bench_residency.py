"""Peak host memory of a Wan2.2 run from bind to decode: every expert in RAM (``full``) against experts and text
encoder kept in their files (``swap_experts`` on the CPU, ``placement.file_staging``), as a ratio.

The tiny Wan2.2 set with its two experts widened (``WIDE``: about 144 MB each as loaded, float32, so the experts, not
the interpreter, dominate the peak), each fused with its own lightx2v-layout LoRA. Each plan runs in a fresh
process (no earlier run's freed memory hides a peak); the peak counts from before the model is loaded, so what
the plan holds is in it. The two runs' outputs are compared bit for bit.

Run as ``python -m bench.bench_residency``; prints one JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .measure import PeakRSS, rss_bytes
from .workload import WorkloadSize, build_transformer, write_lora

WIDE = WorkloadSize(dim=512, heads=8, ffn=2048, text_dim=32, layers=8, rank=16)
PLANS = ("full", "swap_experts")


def build_set(root: Path) -> Path:
    """The tiny Wan2.2 T2V folder with both experts replaced by ``WIDE`` ones, and one LoRA per expert."""
    from lorabind.tiny_models import build_tiny

    build_tiny(root, names=["tiny-wan22-t2v"])
    folder = root / "diffusers" / "tiny-wan22-t2v"
    for seed, expert in enumerate(("transformer", "transformer_2")):
        build_transformer(WIDE, seed=seed).save_pretrained(folder / expert)
        write_lora(str(root / f"{expert}.safetensors"), WIDE, seed=10 + seed)
    return folder


def run_plan(root: Path, memory: str, out: Path) -> dict:
    """One run under ``memory`` in this process: load, encode, then bind -> denoise -> decode under PeakRSS."""
    from lorabind.loaders.binding.bind import bind
    from lorabind.loaders.contract_types import ResolvedSchedule
    from lorabind.loaders.dispatch.generation_steps import decode, denoise, empty_latent, encode_text
    from lorabind.loaders.handles import FuseSpec
    from lorabind.loaders.models import store

    before_load = rss_bytes()
    model = store.load_model(root / "diffusers" / "tiny-wan22-t2v", device="cpu", memory=memory)
    positive = encode_text(model, "a red fox")
    schedule = ResolvedSchedule(sigmas=(1.0, 0.9375, 0.833333, 0.625, 0.0), steps=4, cfg=1.0, shift=1.0,
                                boundary=0.875)
    fuses = [FuseSpec(str(root / f"{e}.safetensors"), 1.0, e) for e in ("transformer", "transformer_2")]
    with PeakRSS() as peak:
        bind(model, fuses, [])
        latent = denoise(model, positive, None, empty_latent(model, 32, 32, frames=1), schedule, seed=3)
        image = decode(model, latent)
    torch.save({"samples": latent.samples, "image": image}, out)
    expert = sum(p.numel() * p.element_size() for p in model.components["transformer"].parameters())
    return {"peak_bytes": peak.peak - before_load, "expert_bytes": expert}


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_set(root)
        peaks, outputs, runs = {}, {}, {}
        for memory in PLANS:
            out = root / f"{memory}.pt"
            line = subprocess.run([sys.executable, "-m", "bench.bench_residency", "--one", str(root), memory,
                                   str(out)], check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            runs[memory] = json.loads(line)
            peaks[memory] = runs[memory]["peak_bytes"]
            outputs[memory] = torch.load(out)
    same = all(torch.equal(outputs["full"][k], outputs["swap_experts"][k]) for k in ("samples", "image"))
    return {"expert_bytes": runs["full"]["expert_bytes"], "peak_full_bytes": peaks["full"], "peak_file_resident_bytes": peaks["swap_experts"],
            "residency_peak_ratio": peaks["swap_experts"] / peaks["full"], "bit_identical": same}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(run_plan(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))))
    else:
        print(json.dumps(main()))
