"""The same binding on every rank, checked before the first step of a parallel job.

Why: every rank binds its patches itself; a rank that read another file (a LoRA replaced between two ranks'
reads, a different ``--set``) would compute another model silently and the gathered result would be neither. So
each rank reduces its bound state to a fingerprint and all ranks compare them; a mismatch names the ranks that
differ from rank 0.

The fingerprint is the patch set (file, component, strength of each fuse; each active adapter) and, per patched
tensor that every rank holds alike, its name, shape and the sum of its bit patterns as integers: exact (no float
rounding), computed where the tensor lives, and different for any changed value in practice (a sum of bit
patterns misses only changes that cancel exactly). Under tensor parallelism a shard holds other rows on each rank
by design, so shards are left out; a replicated tensor (a rowwise layer's bias) still counts.

What it costs: the sums are taken once per change of the binding, not per sampler call. The fingerprint is cached
on the binding state under the patch set and the state's ``version`` (which every bind that writes or restores a
weight bumps), and the sums of a change reach the host in one copy per device, not one ``.item()`` per tensor.
Each sampler call then compares the cached fingerprint in one ``all_gather`` of four integers. Why compare on
every call rather than only after a change: whether a rank's binding changed is that rank's own knowledge, and a
rank that skipped the comparison while another entered it would pair that gather with the other's next collective
(an all-to-all or all-reduce of the denoiser) instead: a mismatch to hang on or to compute garbage from, where
the comparison exists to stop exactly such divergence.
"""

from __future__ import annotations

import hashlib

import torch

from .process_group import ParallelRunError, gather_vectors

_BITS_AS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
WORDS = 4  # the fingerprint: a sha256 digest as four int64
# Elements summed at once. An integer ``sum`` widens its input to int64 first: a whole tensor at once would cost 4x
# a bf16 tensor's bytes (1.2 GiB for an A14B expert's time projection) on every rank just before the first step,
# and chunks of megabytes stayed in the allocator's heap (0.1 GiB at Wan2.1-1.3B); one of 512 KiB is reused.
_SUM_CHUNK = 1 << 16


def bound_state_fingerprint(patch_set: list, tensors: list) -> torch.Tensor:
    """``WORDS`` int64 (on the host) digesting ``patch_set`` (plain, repr-able records) and ``tensors`` ((name,
    tensor) pairs, the tensors as this rank holds them). One device-to-host copy per device the tensors live on."""
    digest = hashlib.sha256(repr(patch_set).encode())
    for name, shape, bits in _bit_sums(tensors):
        digest.update(f"{name}{shape}{bits}".encode())
    return torch.frombuffer(bytearray(digest.digest()), dtype=torch.int64).clone()


def _bit_sums(tensors: list) -> list:
    """(name, shape, sum of bit patterns) per tensor: the sums computed where each tensor lives, brought to the
    host together per device."""
    by_device: dict = {}
    for name, tensor in tensors:
        flat = tensor.detach().contiguous().view(_BITS_AS[tensor.element_size()]).reshape(-1)
        bits = torch.zeros((), dtype=torch.int64, device=tensor.device)
        for start in range(0, flat.numel(), _SUM_CHUNK):  # integer sums: the same total in any grouping
            bits += flat[start:start + _SUM_CHUNK].sum(dtype=torch.int64)
        by_device.setdefault(tensor.device, []).append((name, tuple(tensor.shape), bits))
    found = []
    for entries in by_device.values():
        values = torch.stack([bits for _, _, bits in entries]).cpu().tolist()
        found += [(name, shape, value) for (name, shape, _), value in zip(entries, values)]
    return sorted(found)


def check_same_binding(state, patch_set: list, tensors_of) -> None:
    """Refuse to step when the ranks' bound states differ (a collective: every rank of the job calls it).

    ``state``: the model's binding state (``binding.bind.BindingState``), which holds the cached fingerprint
    (``rank_fingerprint``) and the ``version`` it was made at; ``tensors_of()`` lists the (name, tensor) pairs
    to digest, asked only when the fingerprint must be made again."""
    key = (repr(patch_set), state.version)
    if state.rank_fingerprint is None or state.rank_fingerprint[0] != key:
        state.rank_fingerprint = (key, bound_state_fingerprint(patch_set, tensors_of()))
    fingerprints = gather_vectors(state.rank_fingerprint[1])
    differing = [str(rank) for rank, value in enumerate(fingerprints) if not torch.equal(value, fingerprints[0])]
    if differing:
        ranks = ", ".join(differing)
        raise ParallelRunError(f"the LoRA binding of rank(s) {ranks} differs from rank 0's (another patch set or "
                               "other weights after binding); every rank must bind the same files at the same "
                               "strengths, so the run stops before the first step")
