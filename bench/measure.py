"""Measurement helpers shared by the bench scripts.

Machines here are shared and noisy, so every figure is a *ratio* of two things measured in the same process,
alternating A and B, taking the median of several repetitions after a warm-up.
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Current resident set size, read from /proc (no psutil dependency)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE


class PeakRSS:
    """Context manager sampling RSS in a thread: ``extra`` is the high-water mark minus the RSS at entry."""

    def __init__(self, interval: float = 0.0005):
        self.interval = interval
        self.base = self.peak = 0
        self._running = False

    def __enter__(self) -> "PeakRSS":
        self.base = self.peak = rss_bytes()
        self._running = True
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while self._running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __exit__(self, *exc) -> None:
        self._running = False
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra(self) -> int:
        return self.peak - self.base


@dataclass
class Pair:
    """Medians of A and B timed alternately (seconds)."""

    name_a: str
    name_b: str
    times_a: list = field(default_factory=list)
    times_b: list = field(default_factory=list)

    @property
    def a(self) -> float:
        return statistics.median(self.times_a)

    @property
    def b(self) -> float:
        return statistics.median(self.times_b)

    @property
    def ratio(self) -> float:
        """How many times faster B is than A (A / B)."""
        return self.a / self.b


def timed(fn: Callable[[], None], teardown: Optional[Callable[[], None]] = None) -> float:
    """Seconds ``fn`` takes; ``teardown`` runs after, untimed."""
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    if teardown is not None:
        teardown()
    return elapsed


def alternate(name_a: str, run_a: Callable[[], float], name_b: str, run_b: Callable[[], float],
              reps: int, warmup: int = 1) -> Pair:
    """Run ``run_a``/``run_b`` (each returns its own elapsed seconds) alternately; warm-ups are discarded."""
    for _ in range(warmup):
        run_a()
        run_b()
    pair = Pair(name_a, name_b)
    for _ in range(reps):
        pair.times_a.append(run_a())
        pair.times_b.append(run_b())
    return pair


def alternate_balanced(name_a: str, run_a: Callable[[], float], name_b: str, run_b: Callable[[], float],
                       reps: int, warmup: int = 1) -> Pair:
    """Like ``alternate``, but every other repetition runs B before A (AB, BA, AB, ...). Why: where both sides may
    run the same code, whichever runs second in each pair would otherwise keep a systematic edge (warmer caches,
    a reused allocation), which the ratio of medians would report as a speed-up or a slow-down."""
    for _ in range(warmup):
        run_a()
        run_b()
    pair = Pair(name_a, name_b)
    for rep in range(reps):
        if rep % 2:
            pair.times_b.append(run_b())
            pair.times_a.append(run_a())
        else:
            pair.times_a.append(run_a())
            pair.times_b.append(run_b())
    return pair


def machine_description() -> dict:
    import torch

    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def print_table(title: str, rows: list[tuple]) -> None:
    """A small fixed-width table: rows of (label, value, ...)."""
    print(f"\n{title}")
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
