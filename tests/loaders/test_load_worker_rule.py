"""The loader's worker rule on a disk that reports itself rotating (issue 44 item 7): cloud VMs' virtio disks
do, whatever is behind them, so the disk flag alone loaded every cloud VM one shard at a time. Shards already in
the page cache are read without a seek, so the rule asks the kernel (``mincore``) and uses threads for them."""

from __future__ import annotations

import os

import pytest

from lorabind.loaders.models import parallel_loading

SHARD_BYTES = 1 << 20


@pytest.fixture
def shards(tmp_path):
    """A model folder with three 1 MiB shard files (just written: in the page cache) and a config."""
    folder = tmp_path / "model"
    (folder / "transformer").mkdir(parents=True)
    for index in range(3):
        (folder / "transformer" / f"w-0000{index}.safetensors").write_bytes(os.urandom(SHARD_BYTES))
    (folder / "transformer" / "config.json").write_text("{}")
    return folder


@pytest.fixture
def rotating(monkeypatch):
    """A rotating disk (what a virtio disk reports) on a 4-core machine."""
    monkeypatch.setattr(parallel_loading, "on_rotating_disk", lambda path: True)
    monkeypatch.setattr(parallel_loading, "usable_cores", lambda: 4)


def _evict(files) -> None:
    """Drop the files' clean pages from the page cache (what a reboot or memory pressure does)."""
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_the_weight_files_are_the_shards(shards):
    assert [f.name for f in parallel_loading.weight_files(shards)] == [f"w-0000{i}.safetensors" for i in range(3)]
    one = shards / "transformer" / "w-00001.safetensors"
    assert parallel_loading.weight_files(one) == [one]


def test_a_rotating_disk_whose_shards_are_in_the_page_cache_loads_with_threads(shards, rotating):
    assert parallel_loading.cached_fraction(parallel_loading.weight_files(shards)) >= parallel_loading.CACHED_FRACTION
    workers, why = parallel_loading.worker_rule(shards)
    assert workers == 4 and "rotating disk, but" in why and "page cache" in why
    assert parallel_loading.auto_workers(shards) == 4


def test_a_rotating_disk_whose_shards_are_not_in_memory_loads_one_shard_at_a_time(shards, rotating, monkeypatch):
    files = parallel_loading.weight_files(shards)
    _evict(files)
    evicted = parallel_loading.cached_fraction(files)
    if evicted >= parallel_loading.CACHED_FRACTION:
        pytest.skip(f"this file system keeps the pages ({evicted:.0%} still cached: tmpfs?)")
    assert parallel_loading.worker_rule(shards)[0] == 1
    for file in files:  # a first load reads them in: a reload finds them cached
        file.read_bytes()
    assert parallel_loading.cached_fraction(files) >= parallel_loading.CACHED_FRACTION
    assert parallel_loading.worker_rule(shards)[0] == 4
    monkeypatch.setattr(parallel_loading, "cached_fraction", lambda files: None)  # the kernel cannot be asked
    workers, why = parallel_loading.worker_rule(shards)
    assert workers == 1 and "holds unknown" in why


def test_a_disk_that_does_not_rotate_or_does_not_say_loads_with_threads_without_asking(shards, monkeypatch):
    monkeypatch.setattr(parallel_loading, "usable_cores", lambda: 16)
    monkeypatch.setattr(parallel_loading, "cached_fraction", lambda files: pytest.fail("asked the page cache"))
    for flag, words in ((False, "not a rotating disk"), (None, "the disk does not say")):
        monkeypatch.setattr(parallel_loading, "on_rotating_disk", lambda path, flag=flag: flag)
        workers, why = parallel_loading.worker_rule(shards)
        assert workers == parallel_loading.MAX_WORKERS and words in why
