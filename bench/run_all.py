"""Run every benchmark and print side-by-side ratios (issue 7).

    python bench/run_all.py [--quick] [--json FILE]

Every figure is a ratio measured in one process, alternating A and B, median of >= 5 repetitions after a
warm-up (``--quick``: tiny sizes, 2 repetitions — a smoke mode that keeps the scripts from rotting).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

if __package__ in (None, ""):  # run as a script: make `bench` importable as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "bench"

from . import bench_fuse, bench_peft, bench_rerun, bench_startup  # noqa: E402
from .measure import machine_description, print_table  # noqa: E402
from .workload import FULL, QUICK, write_lora_pair  # noqa: E402

TARGETS = {
    "fuse_speedup_vs_diffusers": (">=", 3.0),
    "fuse_vs_floor": ("<=", 1.3),
    "switch_speedup_vs_diffusers": (">=", 5.0),
    "strength_change_speedup_vs_diffusers": (">=", 5.0),
    "peak_mem_ratio": ("<=", 1.2),
    "rerun_overhead": ("<=", 1.05),
    "help_seconds": ("<", 1.0),
}


def _verdict(name: str, value: float) -> str:
    if name not in TARGETS:
        return ""
    op, target = TARGETS[name]
    ok = {">=": value >= target, "<=": value <= target, "<": value < target}[op]
    return f"target {op} {target:g}: {'met' if ok else 'MISSED'}"


def _memory_in_fresh_process(size_name: str, lora_path: str) -> dict:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "bench.bench_memory", size_name, lora_path], cwd=repo,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions (smoke mode)")
    parser.add_argument("--json", metavar="FILE", help="also write the summary as one JSON object")
    args = parser.parse_args(argv)

    import torch

    size, size_name = (QUICK, "quick") if args.quick else (FULL, "full")
    reps = 2 if args.quick else 5
    print(f"lorabind bench ({size_name}): {size}")
    with tempfile.TemporaryDirectory(prefix="lorabind-bench-") as tmp:
        lora_a, lora_b = write_lora_pair(tmp, size)
        fuse = bench_fuse.run(size, lora_a, lora_b, reps)
        memory = _memory_in_fresh_process(size_name, lora_a)
        peft = bench_peft.run(size, tmp, reps)
        rerun = bench_rerun.run(tmp, reps)
    startup = bench_startup.run(reps)

    summary = {
        "fuse_speedup_vs_diffusers": fuse["fuse"].ratio,
        "fuse_vs_floor": fuse["floor"].b / fuse["floor"].a,
        "switch_speedup_vs_diffusers": fuse["switch"].ratio,
        "strength_change_speedup_vs_diffusers": fuse["strength"].ratio,
        "peak_mem_ratio": memory["peak_mem_ratio"],
        "peft_switch_ms": peft["switch_ms"],
        "rerun_overhead": rerun["rerun_overhead"],
        "help_seconds": startup["help_seconds"],
        "import_seconds": startup["import_seconds"],
    }
    rows = [("metric", "A", "B", "ratio")]
    for key in ("fuse", "floor", "switch", "strength"):
        pair = fuse[key]
        rows.append((f"{pair.name_a} vs {pair.name_b}", f"{pair.a * 1000:.1f} ms", f"{pair.b * 1000:.1f} ms",
                     f"{pair.ratio:.2f}x"))
    print_table("Fuse / switch (median seconds, A vs B)", rows)
    print_table("Memory", [("peak extra RSS during fuse", f"{memory['peak_extra_bytes'] / 2**20:.1f} MiB"),
                           ("backups + largest layer", f"{memory['peak_budget_bytes'] / 2**20:.1f} MiB"),
                           ("restore bit-exact after switch", str(fuse["restore_bit_exact"]))])
    print_table("PEFT activation switch", [(k, v) for k, v in peft.items()])
    print_table("Re-run (seed change only)", [(k, v) for k, v in rerun.items()])
    print_table("Cold start (seconds)", [(k, f"{v:.3f}") for k, v in startup.items()])

    print("\nsummary")
    for name, value in summary.items():
        print(f"{name}: {value:.3f} {_verdict(name, value)}".rstrip())
    if args.json:
        payload = dict(summary, restore_bit_exact=fuse["restore_bit_exact"], peft_base_weights_untouched=peft[
            "base_weights_untouched"], rerun_runtime_overhead=rerun["runtime_overhead"],
            peft_switch_ms_by_size={k: v for k, v in peft.items() if k.startswith("switch_ms_")},
            machine=machine_description(), size=size_name,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            torch_threads=torch.get_num_threads())
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
