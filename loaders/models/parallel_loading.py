"""Parallel loading of sharded weight files, through diffusers' own shard thread pool.

Why: a real Wan2.2-I2V-A14B folder (64.5 GiB in dozens of shards) loads in 283 s one shard after the other and in
56 s with parallel shard loading (vllm-omni, H800). diffusers (>= 0.35) has that thread pool, but switches it on
only through the ``HF_ENABLE_PARALLEL_LOADING`` environment variable, which it reads once at import time into a
module constant, with a fixed worker count (``DEFAULT_HF_PARALLEL_LOADING_WORKERS``) and no per-call argument.
So to make the worker count an option of *our* load, we set those two module attributes for the duration of one
load, under a lock (loads are serialised anyway: ``model_store`` holds its own lock while loading). Only diffusers
models (transformers, VAEs) load in parallel; transformers' text encoders have no such pool.

The worker count when none is asked for (``auto_workers``), so that parallel loading is never slower than
sequential: 1 when the folder is on a rotating disk (threads reading several shards at once make it seek between
them), else one thread per CPU core this process may run on, at most ``MAX_WORKERS``. More threads than cores
only contend: on a loaded 2-core machine 8 workers loaded at 0.35x the sequential speed (issue 33).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Optional

MAX_WORKERS = 8  # diffusers' own default pool size
_lock = threading.Lock()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def on_rotating_disk(path) -> Optional[bool]:
    """Whether ``path`` lives on a rotating disk (Linux ``/sys/dev/block/<major>:<minor>``, a partition's disk
    one level up); None when the system does not say (overlay, network or memory file systems, other OSes)."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return None
    block = f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"
    for flag in (f"{block}/queue/rotational", f"{block}/../queue/rotational"):
        try:
            with open(flag) as fh:
                return fh.read().strip() == "1"
        except OSError:
            continue
    return None


def auto_workers(path) -> int:
    """Shard-loading threads for the folder ``path`` when none is asked for (the rule in the module docstring)."""
    if on_rotating_disk(path):
        return 1
    return max(1, min(usable_cores(), MAX_WORKERS))


def parallel_loading_available() -> bool:
    """True when the installed diffusers has the shard thread pool (0.35 and later)."""
    try:
        from diffusers.models import model_loading_utils, modeling_utils
    except ImportError:
        return False
    return (hasattr(modeling_utils, "HF_ENABLE_PARALLEL_LOADING")
            and hasattr(model_loading_utils, "DEFAULT_HF_PARALLEL_LOADING_WORKERS"))


@contextlib.contextmanager
def shard_loading(workers: int):
    """Load diffusers models' shard files with ``workers`` threads inside the block (``workers`` <= 1, or a
    diffusers without the pool: one shard after the other, diffusers' default). Yields the worker count used."""
    if workers <= 1 or not parallel_loading_available():
        yield 1
        return
    from diffusers.models import model_loading_utils, modeling_utils

    with _lock:
        saved = modeling_utils.HF_ENABLE_PARALLEL_LOADING, model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS
        modeling_utils.HF_ENABLE_PARALLEL_LOADING = True
        model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS = int(workers)
        try:
            yield int(workers)
        finally:
            modeling_utils.HF_ENABLE_PARALLEL_LOADING, model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS = saved
