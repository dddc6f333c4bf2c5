"""Parallel loading of sharded weight files, through diffusers' own shard thread pool.

Why: a real Wan2.2-I2V-A14B folder (64.5 GiB in dozens of shards) loads in 283 s one shard after the other and in
56 s with parallel shard loading (vllm-omni, H800). diffusers (>= 0.35) has that thread pool, but switches it on
only through the ``HF_ENABLE_PARALLEL_LOADING`` environment variable, which it reads once at import time into a
module constant, with a fixed worker count (``DEFAULT_HF_PARALLEL_LOADING_WORKERS``) and no per-call argument.
So to make the worker count an option of *our* load, we set those two module attributes for the duration of one
load, under a lock (loads are serialised anyway: ``model_store`` holds its own lock while loading). Only diffusers
models (transformers, VAEs) load in parallel; transformers' text encoders have no such pool.
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()


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
