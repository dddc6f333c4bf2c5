"""16-bit PCM WAV files with the workflow embedded, written atomically.

Why our own writer: the stdlib ``wave`` module cannot add metadata chunks, and ComfyUI's audio saver needs
torchaudio/av, which are not dependencies of this pack. We write a ``LIST/INFO`` chunk whose ``ICMT`` (comment)
holds a JSON object (e.g. ``{"prompt": ..., "workflow": ...}``), the WAV analogue of ComfyUI's PNG text chunks.
"""

from __future__ import annotations

import json
import struct

from .atomic_files import write_atomically


def _chunk(tag: bytes, payload: bytes) -> bytes:
    pad = b"\x00" if len(payload) % 2 else b""
    return tag + struct.pack("<I", len(payload)) + payload + pad


def wav_bytes(waveform, sample_rate: int, comment: dict | None = None) -> bytes:
    """``waveform`` [channels, samples] float in -1..1 → WAV file bytes (PCM 16-bit, interleaved)."""
    import torch

    samples = (waveform.detach().float().clamp(-1, 1) * 32767.0).round().to(torch.int16)
    channels = int(samples.shape[0])
    data = samples.t().contiguous().numpy().tobytes()  # interleave channels frame by frame
    block_align = channels * 2
    fmt = struct.pack("<HHIIHH", 1, channels, int(sample_rate), int(sample_rate) * block_align, block_align, 16)
    body = b"WAVE" + _chunk(b"fmt ", fmt) + _chunk(b"data", data)
    if comment:
        text = json.dumps(comment, ensure_ascii=False).encode("utf-8") + b"\x00"
        body += _chunk(b"LIST", b"INFO" + _chunk(b"ICMT", text))
    return b"RIFF" + struct.pack("<I", len(body)) + body


def write_wav(path: str, waveform, sample_rate: int, comment: dict | None = None) -> None:
    data = wav_bytes(waveform, sample_rate, comment)

    def write(temp_path: str) -> None:
        with open(temp_path, "wb") as handle:
            handle.write(data)

    write_atomically(path, write)
