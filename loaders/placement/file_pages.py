"""Host weights that are still pages of the user's file, copied into the process's own memory before they are kept.

Why: diffusers and transformers load safetensors weights on the CPU as views of a private mapping of the file
(``safetensors`` maps it), and a weight the load did not cast stays that mapping for as long as the model lives.
Then the file on disk is part of the running model (issues 52 and 61):

* a file truncated under a running process kills it with SIGBUS the next time a page past the new end is read
  (``cp`` over a model file truncates it first). Pages a bind already wrote do not help: truncating a file unmaps
  a private mapping's copied pages too (POSIX: a page past the end of the file faults), so only memory that is
  not a mapping of the file is safe;
* a file rewritten in place with the same size changes every weight the process has not written yet: the next
  output changes, silently (a rewritten VAE changed it by up to 255).

So every host-resident tensor whose bytes lie in a mapping of a file on disk is replaced, in place (``.data``),
by a copy in anonymous memory, right after the model is built. The copy starts at the same address modulo 64
bytes as the mapped tensor (``staging.same_alignment_copy``): the CPU kernels round differently at another
alignment, and a loaded model must compute exactly what it computed before. What this costs: one copy of the
host-resident weights at load, and their pages count as the process's own memory instead of as page cache the
kernel may drop. Weights a plan moves to an accelerator leave the host anyway and are not copied; components a
plan keeps in their files (``file_staging``) hold no pages between uses and re-read through plain reads.

Where the system has no ``/proc/self/maps`` (not Linux) nothing is found and nothing is copied: there the weights
stay mapped, and a file changed under a running process still reaches it.
"""

from __future__ import annotations

import bisect
from typing import Optional

import torch
from torch import nn

from .staging import module_tensors, same_alignment_copy

_MAPS = "/proc/self/maps"
_NOT_USER_FILES = ("/dev/", "/memfd:", "/proc/", "/sys/")  # shared memory, devices: not a file a user replaces


class FileMappings:
    """The address ranges of this process's mappings of files on disk, read once (``file_mapped_ranges``)."""

    def __init__(self, ranges: list):
        self.ranges = sorted(ranges)

    def holds(self, address: int) -> bool:
        """Whether ``address`` lies in a mapping of a file."""
        index = bisect.bisect_right(self.ranges, (address, float("inf"))) - 1
        return index >= 0 and self.ranges[index][0] <= address < self.ranges[index][1]


def file_mapped_ranges() -> FileMappings:
    """This process's mappings of files on disk now; none where the system does not say (module docstring)."""
    try:
        with open(_MAPS, encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return FileMappings([])
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[4] == "0" or not fields[5].startswith("/"):
            continue  # anonymous memory, the heap, the stack, [vdso]...
        if fields[5].startswith(_NOT_USER_FILES):
            continue
        start, end = (int(address, 16) for address in fields[0].split("-"))
        ranges.append((start, end))
    return FileMappings(ranges)


def copy_out_of_files(module: nn.Module, mapped: Optional[FileMappings] = None) -> int:
    """Replace each CPU tensor of ``module`` that lies in a file mapping by an anonymous copy at the same
    alignment (module docstring); returns the bytes copied. ``mapped``: ``file_mapped_ranges()``, read once for
    several modules."""
    mapped = file_mapped_ranges() if mapped is None else mapped
    if not mapped.ranges:
        return 0
    copied = 0
    seen: set = set()
    for tensor in module_tensors(module):
        if id(tensor) in seen or tensor.device.type != "cpu" or tensor.numel() == 0:
            continue
        seen.add(id(tensor))
        if mapped.holds(tensor.data_ptr()):
            with torch.no_grad():
                tensor.data = same_alignment_copy(tensor.data)
            copied += tensor.numel() * tensor.element_size()
    return copied
