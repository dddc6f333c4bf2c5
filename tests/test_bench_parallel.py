"""bench/bench_parallel.py's device paths (the Ulysses speed-up, the tp=2 memory comparison) skip cleanly, saying
why, where fewer than 2 GPUs are visible (its CPU figures run in the slow ``run_all --quick`` smoke test)."""

import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture()
def bench_parallel():
    sys.path.insert(0, str(ROOT))
    try:
        from bench import bench_parallel
    finally:
        sys.path.remove(str(ROOT))
    return bench_parallel


@pytest.mark.parametrize("available, count", [(False, 0), (True, 1)])
def test_the_gpu_speedup_needs_two_devices_and_says_so(bench_parallel, monkeypatch, capsys, available, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    assert bench_parallel.run_device() == {}
    assert f"needs at least 2 CUDA devices, this machine has {count}; skipped" in capsys.readouterr().out


def test_the_gpu_memory_comparison_needs_two_devices_and_says_so(bench_parallel, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert bench_parallel.main(["--memory", "--device", "cuda"]) == 0
    assert "tp=2 needs 2 CUDA devices, this machine has 1" in capsys.readouterr().out
