"""Loading a single file never holds the checkpoint twice: peak RSS over the load stays under 1.3x the file."""

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _bench(*args):
    proc = subprocess.run([sys.executable, "-m", "bench.bench_single_file", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_peak_rss_while_loading_stays_under_1_3x_the_file(tmp_path):
    _bench("write", str(tmp_path), "probe")
    result = json.loads(_bench("load", "file", str(tmp_path)).strip().splitlines()[-1])
    if not result["peak_measured"]:
        pytest.skip("this kernel does not let a process reset its RSS high-water mark (/proc/self/clear_refs)")
    size = result["file_bytes"]
    assert size > 200 * 2**20  # large enough for a second copy to show
    assert result["parameters"] * 2 >= 0.99 * size  # bf16: the model itself is one file's worth
    assert result["extra"] < 1.3 * size, f"peak {result['extra'] / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file"
