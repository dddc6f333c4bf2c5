"""Real size on this CPU: the full Wan2.1-1.3B transformer (30 blocks, random bf16 weights saved to and loaded
from a diffusers folder) with a rank-64 LoRA in the layout lightx2v publishes (``workload.write_published_lora``:
1,428 tensors, every block linear's pair and bias diff, the norm and modulation diffs, the embedding and head pairs;
diffusers drops the norm and modulation diffs, see ``bench_rebind``).

Metrics: ``fuse_real_size_vs_diffusers`` (diffusers load+fuse time / lorabind fuse time, on their own loaded
copies), ``bind_peak_rss_layers`` (peak extra RSS of a lorabind bind / the largest patched layer, in a fresh
process; the originals are re-read from the model's file, so no backups are held) and restore time with
file-backed originals vs RAM backups. ``--quick`` uses the tiny bench width instead (2 blocks).
Run the RSS part alone as ``python -m bench.bench_real_size rss FOLDER LORA``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.families import family_by_id
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import map_to_model, read_lora
from lorabind.loaders.models.store import LoadedModel

from .bench_fuse import DiffusersSide, fuse_timers
from .measure import PeakRSS, alternate, timed
from .workload import QUICK, WorkloadSize, build_transformer, write_published_lora

# diffusers' Wan2.1-T2V-1.3B transformer: the workload recipe at its real depth (lorabind's shipped config
# wan2.1-t2v-1.3b has the same widths)
WAN21_1_3B = WorkloadSize(dim=1536, heads=12, ffn=8960, text_dim=4096, layers=30, rank=64)


class _NoSources:
    """Weight sources that know no file: every original becomes a RAM backup (the comparison side)."""

    @staticmethod
    def lookup(component, state_key):
        return None


def write_model(directory: str, size: WorkloadSize) -> str:
    """A diffusers folder holding only ``transformer/``: random bf16 weights, written once."""
    folder = os.path.join(directory, "wan21-1.3b-random")
    transformer = build_transformer(size)
    transformer.save_pretrained(os.path.join(folder, "transformer"), safe_serialization=True)
    del transformer
    gc.collect()
    return folder


def load_model(folder: str) -> LoadedModel:
    from diffusers import WanTransformer3DModel

    transformer = WanTransformer3DModel.from_pretrained(os.path.join(folder, "transformer"),
                                                        torch_dtype=torch.bfloat16).eval().requires_grad_(False)
    return LoadedModel(path=folder, name="wan21-1.3b-random", family="wan2.1", pipeline=None,
                       components={"transformer": transformer})


def _fuse(path: str) -> FuseSpec:
    return FuseSpec(path=path, strength=1.0, component="transformer", name="rank64")


def largest_patched_layer(model: LoadedModel, lora_path: str) -> int:
    modules = dict(model.components["transformer"].named_modules())
    targets = map_to_model(read_lora(lora_path), "wan2.1", family_by_id("wan2.1")).targets
    return max(getattr(modules[path], name).nbytes for path, target in targets.items()
               for name in target.parameter_deltas())  # blocks.N: its scale_shift_table (diff_m)


def _fault_in(model: LoadedModel) -> None:
    """Touch every page of the model's weights. diffusers leaves CPU weights mapped from the safetensors file,
    resident only once read, so without this the first bind would count the model's own pages as its memory."""
    with torch.no_grad():
        for tensor in model.components["transformer"].parameters():
            tensor.reshape(-1)[:: max(1, 4096 // tensor.element_size())].float().sum()


def measure_rss(folder: str, lora_path: str) -> dict:
    """Peak extra RSS of one bind (file-backed originals) over the largest patched layer; fresh process."""
    model = load_model(folder)
    _fault_in(model)
    largest = largest_patched_layer(model, lora_path)  # also reads and caches the LoRA: we measure the bind
    for target in map_to_model(read_lora(lora_path), "wan2.1", family_by_id("wan2.1")).targets.values():
        for delta in (d for deltas in target.parameter_deltas().values() for d in deltas):
            for tensor in delta.tensors():
                tensor.sum()
    gc.collect()
    with PeakRSS() as peak:
        report = binding.bind(model, [_fuse(lora_path)], [])
    held = report.restore_sources["transformer"]
    return {"peak_extra_bytes": peak.extra, "largest_layer_bytes": largest,
            "bind_peak_rss_layers": peak.extra / largest, "file_backed": held["file"], "ram_backups": held["ram"]}


def _rss_in_fresh_process(folder: str, lora_path: str) -> dict:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "bench.bench_real_size", "rss", folder, lora_path], cwd=repo,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(directory: str, quick: bool, reps: int) -> dict:
    size = QUICK if quick else WAN21_1_3B
    folder = write_model(directory, size)
    lora = write_published_lora(os.path.join(directory, "real_size_rank64.safetensors"), size, seed=7)
    rss = _rss_in_fresh_process(folder, lora)

    ours = load_model(folder)
    theirs = DiffusersSide(load_model(folder).components["transformer"])

    theirs_fuse, ours_fuse = fuse_timers(ours, theirs, lora)
    fuse = alternate("diffusers load+fuse", theirs_fuse, "lorabind fuse", ours_fuse, reps)
    del theirs
    gc.collect()

    # restore: the same module bound through a model whose originals are re-read from the file, and through
    # one that keeps RAM backups
    ram_side = LoadedModel(path=folder, name="ram-backups", family="wan2.1", pipeline=None,
                           components=ours.components, weight_sources=_NoSources())

    def restore_time(model: LoadedModel) -> float:
        binding.bind(model, [_fuse(lora)], [])
        return timed(lambda: binding.unbind(model))

    restore = alternate("restore from RAM backups", lambda: restore_time(ram_side),
                        "restore from the file", lambda: restore_time(ours), reps)
    label = "tiny bench width (--quick)" if quick else "Wan2.1-1.3B transformer"
    return {"fuse": fuse, "restore": restore, "rss": rss, "label": f"{label}, {size.layers} blocks"}


if __name__ == "__main__":
    if sys.argv[1] == "rss":
        print(json.dumps(measure_rss(sys.argv[2], sys.argv[3])))
