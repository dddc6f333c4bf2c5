"""Hostile safetensors files generated at test time (never committed): headers over the header budget."""

from __future__ import annotations

import struct

from lorabind.loaders.lora.safetensors_header import MAX_HEADER_TENSORS


def write_huge_header(path, header_bytes: int = 90 * 1024 * 1024) -> None:
    """A file whose prefix declares a ``header_bytes`` header; sparse, so it costs no disk."""
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", header_bytes))
        handle.truncate(8 + header_bytes)


def write_many_tensors(path, count: int = MAX_HEADER_TENSORS + 1) -> None:
    """A well-formed header of ``count`` empty LoRA tensors (no data at all)."""
    entries = b",".join(b'"lora_unet_b%d.lora_down.weight":{"dtype":"F16","shape":[0,4],"data_offsets":[0,0]}' % i
                        for i in range(count))
    header = b"{" + entries + b"}"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
