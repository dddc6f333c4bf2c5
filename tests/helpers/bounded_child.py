"""Run a case that may hang or fill memory in a child process, and measure how it ends.

Why a child: a FIFO read waits forever and a read of ``/dev/zero`` grows until memory runs out; before a fix, such
a case must fail its test within a bound, not hang the session or take the machine's memory. The child imports
what the case needs, then caps its own address space at what it holds plus ``headroom_mib`` (so a runaway read
ends in ``MemoryError`` there), times the case and reports its peak resident memory above what it held before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

_RUNNER = textwrap.dedent("""
    import json, resource, sys, time
    {setup}

    def _status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0

    resource.setrlimit(resource.RLIMIT_AS, (_status("VmSize") + {headroom} * 2**20, resource.RLIM_INFINITY))
    open("/proc/self/clear_refs", "w").write("5")  # the peak from here on
    resting = _status("VmRSS")
    started = time.perf_counter()
    try:
        outcome = "returned: " + str(case())
    except BaseException as exc:
        outcome = f"raised {{type(exc).__name__}}: {{exc}}"
    seconds = time.perf_counter() - started
    print(json.dumps({{"seconds": seconds, "peak_above_mib": (_status("VmHWM") - resting) / 2**20,
                      "outcome": outcome}}))
""")


@dataclass(frozen=True)
class ChildRun:
    seconds: float  # the case alone, measured in the child
    peak_above_mib: float  # peak resident memory during the case, above what the child held before it
    outcome: str  # "returned: ..." or "raised Type: message"


def run_case(setup: str, *, timeout: float = 120.0, headroom_mib: int = 1024, env: dict | None = None) -> ChildRun:
    """Run ``setup`` (Python source defining ``case()``) in a child process; raise AssertionError when the child
    does not answer within ``timeout`` seconds (imports included) or dies."""
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))}
    script = _RUNNER.format(setup=textwrap.dedent(setup), headroom=int(headroom_mib))
    try:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no answer within {timeout:.0f} s (it hangs)") from None
    assert done.returncode == 0, f"the child died (exit {done.returncode}): {done.stderr[-2000:]}"
    return ChildRun(**json.loads(done.stdout.strip().splitlines()[-1]))
