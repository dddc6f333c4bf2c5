"""A weight still mapped from its safetensors file is faulted in writable in one call before its first write."""

import resource
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from lorabind.loaders.binding.writable_pages import prefault_for_write


def _faults_while(action) -> int:
    """Minor page faults this process takes during ``action()``."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    action()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_a_file_mapped_weight_becomes_private_without_changing_it_or_its_file(tmp_path):
    path = tmp_path / "w.safetensors"
    pages = 1024  # 4 MiB of float32
    save_file({"a": torch.arange(pages * 1024, dtype=torch.float32), "b": torch.ones(pages * 1024)}, str(path))
    loaded = load_file(str(path))
    unprepared, weight = loaded["a"], loaded["b"]
    assert _faults_while(lambda: unprepared.add_(1.0)) >= pages // 2  # a write faults page by page
    if not prefault_for_write(weight):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    assert _faults_while(lambda: weight.add_(1.0)) < pages // 8  # faulted in by the one call before
    assert torch.equal(weight, torch.full((pages * 1024,), 2.0))
    assert torch.equal(load_file(str(path))["b"], torch.ones(pages * 1024))  # private copies: the file is untouched


def test_nothing_is_asked_for_an_empty_tensor_or_one_off_the_cpu():
    assert prefault_for_write(torch.empty(0)) is False
    assert prefault_for_write(torch.empty(4, 4, device="meta")) is False
