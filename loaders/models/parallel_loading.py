"""Parallel loading of sharded weight files, through diffusers' own shard thread pool.

Why: a real Wan2.2-I2V-A14B folder (64.5 GiB in dozens of shards) loads in 283 s one shard after the other and in
56 s with parallel shard loading (vllm-omni, H800). diffusers (>= 0.35) has that thread pool, but switches it on
only through the ``HF_ENABLE_PARALLEL_LOADING`` environment variable, which it reads once at import time into a
module constant, with a fixed worker count (``DEFAULT_HF_PARALLEL_LOADING_WORKERS``) and no per-call argument.
So to make the worker count an option of *our* load, we set those two module attributes for the duration of one
load, under a lock (loads are serialised anyway: ``model_store`` holds its own lock while loading). Only diffusers
models (transformers, VAEs) load in parallel; transformers' text encoders have no such pool.

The worker count when none is asked for (``worker_rule``), so that parallel loading is never slower than
sequential: 1 when the folder is on a rotating disk (threads reading several shards at once make it seek between
them) and its weight files are not already in the page cache, else one thread per CPU core this process may run
on, at most ``MAX_WORKERS``. More threads than cores only contend: on a loaded 2-core machine 8 workers loaded at
0.35x the sequential speed (issue 33). Why the page cache: cloud VMs' virtio disks report themselves rotating
whatever is behind them, so the disk flag alone made every cloud VM load sequentially (issue 44); a shard already
in memory is read without touching the disk, so threads cannot make it seek. Whether it is, ``mincore`` says (the
kernel's own account of the pages, without reading them); where it cannot be asked, the shards count as uncached.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from pathlib import Path
from typing import Optional

MAX_WORKERS = 8  # diffusers' own default pool size
CACHED_FRACTION = 0.9  # of the weight files' pages in memory: a rotating disk then seeks for the rest only
WEIGHT_SUFFIXES = (".safetensors", ".gguf")
_WINDOW = 1 << 30  # bytes mapped at a time to ask mincore (a 64 GiB expert folder: 64 calls, 256 KiB of answer each)
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


def weight_files(path) -> list:
    """The weight files a load of ``path`` (a model folder, or one file) reads."""
    path = Path(path)
    if path.is_file():
        return [path]
    return sorted(f for f in path.rglob("*") if f.name.endswith(WEIGHT_SUFFIXES) and f.is_file())


def cached_fraction(files) -> Optional[float]:
    """The share of the ``files``' pages the page cache holds (``mincore`` over a read-only map, window by
    window: nothing is read); None where the system cannot say (not Linux or another Unix, an unreadable file)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                                  ctypes.c_int, ctypes.c_int, ctypes.c_long)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
        resident = total = 0
        for file in files:
            with open(file, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                for offset in range(0, size, _WINDOW):
                    in_memory, pages = _resident_pages(libc, fh.fileno(), offset, min(_WINDOW, size - offset))
                    resident, total = resident + in_memory, total + pages
    except (OSError, AttributeError, ValueError):
        return None
    return resident / total if total else None


def _resident_pages(libc, fd: int, offset: int, length: int) -> tuple:
    """(pages in memory, pages) of one window of an open file."""
    address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        pages = (length + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        answer = ctypes.create_string_buffer(pages)
        if libc.mincore(ctypes.c_void_p(address), length, answer) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return pages - answer.raw.count(0), pages  # Linux sets only the low bit: a byte per page, 0 = not in memory
    finally:
        libc.munmap(ctypes.c_void_p(address), length)


def worker_rule(path) -> tuple:
    """(shard-loading threads for ``path`` when none is asked for, why): the rule in the module docstring."""
    per_core = max(1, min(usable_cores(), MAX_WORKERS))
    cores = f"{per_core} worker(s): one per usable core, at most {MAX_WORKERS}"
    rotating = on_rotating_disk(path)
    if not rotating:
        return per_core, f"{cores} ({'not a rotating disk' if rotating is False else 'the disk does not say'})"
    cached = cached_fraction(weight_files(path))
    if cached is not None and cached >= CACHED_FRACTION:
        return per_core, f"{cores} (a rotating disk, but {cached:.0%} of the weight files are in the page cache)"
    held = "unknown" if cached is None else f"{cached:.0%}"
    return 1, (f"1 worker (a rotating disk, and the page cache holds {held} of the weight files: threads would "
               "make it seek between shards)")


def auto_workers(path) -> int:
    """Shard-loading threads for the folder ``path`` when none is asked for (``worker_rule``)."""
    return worker_rule(path)[0]


def parallel_loading_available() -> bool:
    """True when the installed diffusers has the shard thread pool (0.35 and later)."""
    try:
        from diffusers.models import model_loading_utils, modeling_utils
    except ImportError:
        return False
    return (hasattr(modeling_utils, "HF_ENABLE_PARALLEL_LOADING")
            and hasattr(model_loading_utils, "DEFAULT_HF_PARALLEL_LOADING_WORKERS"))


def threads_can_load() -> bool:
    """Whether a load here may use shard threads at all (the installed diffusers has the pool, and this thread is
    not inside ``torch.inference_mode``: see ``shard_loading``). Asked before the worker rule, whose page-cache
    question maps every weight file, so a load that stays on one thread (every load inside ComfyUI) skips it."""
    import torch  # lazy: the worker rule and `plan` need no torch

    return parallel_loading_available() and not torch.is_inference_mode_enabled()


@contextlib.contextmanager
def shard_loading(workers: int):
    """Load diffusers models' shard files with ``workers`` threads inside the block (``workers`` <= 1, or a
    diffusers without the pool: one shard after the other, diffusers' default). Yields the worker count used.

    Inside ``torch.inference_mode`` (ComfyUI runs every node in it) the load stays on this thread: diffusers' pool
    threads do not inherit the mode, and making a parameter there of a tensor this thread made fails ("Setting
    requires_grad=True on inference tensor outside InferenceMode")."""
    if workers <= 1 or not threads_can_load():
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
