"""``lorabind inspect`` cost: a LoRA file alone vs the same file accounted against a model (``--model``), each in
a fresh process, alternating, median of several runs; plus ``import torch`` alone, the floor of both.

    python -m bench.bench_inspect [--reps N]

Goal (issue 19): ``--model`` within 1.5x of the file alone, because it reads only the safetensors headers of the
model's denoisers (names and shapes as meta tensors) instead of loading the pipeline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _wall(args: list) -> float:
    start = time.perf_counter()
    subprocess.run(args, capture_output=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - start


def run(reps: int) -> dict:
    from lorabind.tiny_models import build_tiny
    from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, write_fixture_loras

    with tempfile.TemporaryDirectory() as root:
        build_tiny(root, names=("tiny-wan22-t2v",))
        write_fixture_loras(root)
        lora = os.path.join(root, "loras", WAN22_HIGH)
        model = os.path.join(root, "diffusers", "tiny-wan22-t2v")
        cli = [sys.executable, "-m", "lorabind.runtime.cli", "inspect", lora]
        _wall(cli + ["--model", model])  # warm the page cache and .pyc files
        alone, with_model, torch_only = [], [], []
        for _ in range(reps):
            alone.append(_wall(cli))
            with_model.append(_wall(cli + ["--model", model]))
            torch_only.append(_wall([sys.executable, "-c", "import torch"]))
    result = {"inspect_file_s": statistics.median(alone), "inspect_with_model_s": statistics.median(with_model),
              "import_torch_s": statistics.median(torch_only)}
    result["with_model_ratio"] = result["inspect_with_model_s"] / result["inspect_file_s"]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    for key, value in run(parser.parse_args().reps).items():
        print(f"{key:24s} {value:.3f}")
