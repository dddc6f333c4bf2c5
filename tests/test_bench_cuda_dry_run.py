"""Keep the device bench from rotting: its entries run end to end on the CPU with a tiny configuration, and
``run_all.py --device cuda`` exits cleanly saying why when there is no CUDA. No timing is asserted."""

import math
import pathlib
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_bench_cuda_entries_run_on_a_tiny_config(tiny_models_root):
    sys.path.insert(0, str(ROOT))
    try:
        from bench import bench_cuda
    finally:
        sys.path.remove(str(ROOT))
    result = bench_cuda.run(tiny_models_root / "diffusers" / "tiny-wan22-t2v" / "transformer", "cpu", steps=2,
                            size=(1, 16, 16))
    for key in ("fuse_14b_vs_diffusers", "fuse_14b_vs_hbm_floor", "expert_swap_vs_upload_floor",
                "seconds_per_step_vs_diffusers"):
        assert math.isfinite(result[key]) and result[key] > 0, key
    details = result["details"]
    # the timed swap, then the denoise: back to the high-noise expert at the start and the swap at the boundary
    assert details["swap"]["swaps"] == 3 and details["swap"]["expert_bytes"] > 0
    assert details["fuse"]["touched_bytes"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_run_all_device_cuda_without_cuda_says_so_and_exits_cleanly(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py"), "--device", "cuda"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--device cuda: this torch" in proc.stdout and "sees no CUDA device" in proc.stdout
