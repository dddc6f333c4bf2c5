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


def write_special_file(path, kind: str) -> None:
    """At ``path``: a FIFO (``fifo``), a link to ``/dev/zero`` (``dev-zero``) or a 10 GB sparse file (``huge``)."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        with open(path, "wb") as handle:
            handle.truncate(10 << 30)  # no disk


def rewrite_in_place(weights) -> None:
    """Flip every data byte of a safetensors file in place, then set its mtime back: the same inode, size and
    mtime (what a tool writing into the file leaves; only the ctime tells)."""
    import os

    before = os.stat(weights)
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:] = bytes(b ^ 0x5A for b in data[start:])
    with open(weights, "r+b") as handle:
        handle.write(data)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
