"""Cold start: ``lorabind --help`` wall time and ``import lorabind`` (the pack's ``__init__``), each in a fresh
process, median of several runs. Also reported: resolving NODE_CLASS_MAPPINGS (what ComfyUI does right after
import; it pulls in torch and diffusers, which ComfyUI has already imported by then)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

_IMPORT_TIMER = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"


def _in_fresh_process(stmt: str) -> float:
    out = subprocess.run([sys.executable, "-c", _IMPORT_TIMER.format(stmt=stmt)], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _help_wall_time() -> float:
    exe = shutil.which("lorabind") or os.path.join(os.path.dirname(sys.executable), "lorabind")
    start = time.perf_counter()
    subprocess.run([exe, "--help"], capture_output=True, check=True)
    return time.perf_counter() - start


def run(reps: int) -> dict:
    _help_wall_time()  # warm the page cache / .pyc files once
    help_s = statistics.median(_help_wall_time() for _ in range(reps))
    import_s = statistics.median(_in_fresh_process("import lorabind") for _ in range(reps))
    nodes_s = statistics.median(
        _in_fresh_process("import lorabind; lorabind.NODE_CLASS_MAPPINGS") for _ in range(max(1, reps // 2)))
    return {"help_seconds": help_s, "import_seconds": import_s, "node_mappings_seconds": nodes_s}
