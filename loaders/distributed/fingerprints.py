"""The same binding on every rank, checked before the first step of a parallel job.

Why: under sequence and CFG parallelism every rank holds the whole model and binds the same patches itself; a rank
that read another file (a LoRA replaced between two ranks' reads, a different ``--set``) would compute another
model silently and the gathered result would be neither. So each rank reduces its bound state to a fingerprint
and all ranks compare them; a mismatch names the ranks that differ from rank 0.

The fingerprint is the patch set (file, component, strength of each fuse; each active adapter) and, per patched
tensor, its name, shape and the sum of its bit patterns as integers: exact (no float rounding), computed where the
tensor lives (no device-to-host copy of a 14B model's weights), and different for any changed value in practice
(a sum of bit patterns misses only changes that cancel exactly).
"""

from __future__ import annotations

import hashlib

import torch

from .process_group import ParallelRunError, gather_objects

_BITS_AS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bound_state_fingerprint(patch_set: list, tensors: list) -> str:
    """A hex digest of ``patch_set`` (plain, repr-able records) and ``tensors`` ((name, tensor) pairs)."""
    digest = hashlib.sha256(repr(patch_set).encode())
    for name, tensor in tensors:
        bits = tensor.detach().contiguous().view(_BITS_AS[tensor.element_size()])
        digest.update(f"{name}{tuple(tensor.shape)}{bits.sum(dtype=torch.int64).item()}".encode())
    return digest.hexdigest()


def check_same_binding(patch_set: list, tensors: list) -> None:
    """Refuse to step when the ranks' bound states differ (a collective: every rank of the job calls it)."""
    fingerprints = gather_objects(bound_state_fingerprint(patch_set, tensors))
    differing = [str(rank) for rank, value in enumerate(fingerprints) if value != fingerprints[0]]
    if differing:
        ranks = ", ".join(differing)
        raise ParallelRunError(f"the LoRA binding of rank(s) {ranks} differs from rank 0's (another patch set or "
                               "other weights after binding); every rank must bind the same files at the same "
                               "strengths, so the run stops before the first step")
