"""Single-file loading vs the diffusers folder: load time and peak RSS (issue 12).

Both loads run in fresh processes on the same random weights: a Wan transformer written once as a native
single file (bf16) and once as a diffusers folder. ``full`` uses the real Wan2.1-T2V-1.3B configuration
(about 2.8 GB per copy); ``quick`` a small one so the smoke run stays fast.

    python -m bench.bench_single_file write DIR {full|quick|probe}   # writes DIR/model.safetensors + DIR/folder
    python -m bench.bench_single_file load {file|folder} DIR          # prints one JSON line

Each load reads every weight once inside the timed, peak-measured window (safetensors may map the file and
read pages only when touched), so both figures cover the weights really being in memory. The checksums of the
two loads must agree: the single file holds exactly the folder's weights.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

CONFIGS = {
    "full": None,  # the shipped real configuration: loaders/families/wan/configs/single_files/wan2.1_t2v_1.3B.json
    "quick": dict(num_attention_heads=4, attention_head_dim=32, num_layers=2, ffn_dim=256, text_dim=128),
    # ~256 MB of bf16: large enough that a second copy of the checkpoint would show in the peak
    "probe": dict(num_attention_heads=8, attention_head_dim=128, num_layers=8, ffn_dim=4096, text_dim=256),
}


def _config(size: str) -> dict:
    from lorabind.loaders.models.single_file import catalog

    base = dict(catalog.config("wan2.1_t2v_1.3B"))
    return {**base, **(CONFIGS[size] or {})}


def write(folder: Path, size: str) -> None:
    """Random bf16 weights, once as a native single file and once as a diffusers folder."""
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import save_file

    from lorabind.loaders.families import family_by_id
    from lorabind.loaders.models.single_file.native_files import native_tensors

    config = _config(size)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    with torch.device("meta"):
        model = WanTransformer3DModel.from_config(config)
    state = {k: torch.randn(v.shape, dtype=torch.bfloat16) * 0.02 for k, v in model.state_dict().items()}
    transformer = family_by_id("wan2.1").layout.single_file_kinds[0]  # the family's first kind is its denoiser
    save_file(native_tensors(state, transformer.layout(config)), str(folder / "model.safetensors"))
    (folder / "folder").mkdir(exist_ok=True)
    (folder / "folder" / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel", **config}))
    save_file(state, str(folder / "folder" / "diffusion_pytorch_model.safetensors"))


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Reset the kernel's high-water mark (VmHWM) so the peak covers only the load."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return _rss()


def load(kind: str, folder: Path) -> dict:
    """Load once (after importing everything) and report seconds and peak RSS above the baseline."""
    import torch
    from diffusers import WanTransformer3DModel

    from lorabind.loaders.families import family_by_id
    from lorabind.loaders.io.single_file_kinds import KnownModel
    from lorabind.loaders.models.single_file import catalog
    from lorabind.loaders.models.single_file.detect import detect
    from lorabind.loaders.models.single_file.loading import load_component

    path = folder / "model.safetensors"
    transformer = family_by_id("wan2.1").layout.single_file_kinds[0]  # the family's first kind is its denoiser
    probe = KnownModel(config=str(folder / "config.json"), kind=transformer.kind, title="bench probe", size="probe",
                       variant="t2v")
    detected = detect(str(path), path.name, models=catalog.known_models() + (probe,)) if kind == "file" else None
    baseline = _rss()
    reset = _reset_peak()
    start = time.perf_counter()
    if kind == "file":
        model = load_component(detected, dtype=torch.bfloat16)
    else:
        model = WanTransformer3DModel.from_pretrained(str(folder / "folder"), torch_dtype=torch.bfloat16)
    # safetensors may hand out tensors backed by the file's pages, read only when first touched: read every
    # weight once so the peak counts the whole model being resident
    checksum = sum(float(p.detach().float().sum()) for p in model.parameters())
    seconds = time.perf_counter() - start
    peak = _peak() if reset else max(_rss(), baseline)
    parameters = sum(p.numel() for p in model.parameters())
    return {"seconds": seconds, "baseline": baseline, "peak": peak, "extra": peak - baseline,
            "file_bytes": path.stat().st_size, "parameters": parameters, "peak_measured": reset,
            "checksum": checksum}


def _in_fresh_process(*args) -> str:
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "bench.bench_single_file", *args], cwd=repo, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def run(size_name: str, tmp: str, reps: int) -> dict:
    """Median load time and peak extra RSS, single file vs folder, alternating, each load in a fresh process."""
    import statistics

    folder = Path(tmp) / "single_file"
    _in_fresh_process("write", str(folder), "full" if size_name == "full" else "quick")
    results: dict = {"file": [], "folder": []}
    for _ in range(reps):
        for kind in ("file", "folder"):
            results[kind].append(json.loads(_in_fresh_process("load", kind, str(folder))))
    median = {kind: {key: statistics.median(r[key] for r in runs) for key in ("seconds", "extra")}
              for kind, runs in results.items()}
    file_bytes = results["file"][0]["file_bytes"]
    return {
        "single_file_load_vs_folder": median["file"]["seconds"] / median["folder"]["seconds"],
        "single_file_peak_rss_ratio": median["file"]["extra"] / median["folder"]["extra"],
        "single_file_peak_vs_file_size": median["file"]["extra"] / file_bytes,
        "file_seconds": median["file"]["seconds"], "folder_seconds": median["folder"]["seconds"],
        "file_extra_mib": median["file"]["extra"] / 2**20, "folder_extra_mib": median["folder"]["extra"] / 2**20,
        "file_mib": file_bytes / 2**20, "checksums_equal": len({r["checksum"] for rs in results.values()
                                                                for r in rs}) == 1,
    }


def main(argv) -> int:
    if argv[0] == "write":
        write(Path(argv[1]), argv[2])
    else:
        print(json.dumps(load(argv[1], Path(argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
