"""16-bit PCM WAV files with the workflow embedded, written atomically.

Why our own writer: the stdlib ``wave`` module cannot add metadata chunks, and ComfyUI's audio saver needs
torchaudio/av, which are not dependencies of this pack. We write a ``LIST/INFO`` chunk whose ``ICMT`` (comment)
holds a JSON object (e.g. ``{"prompt": ..., "workflow": ...}``), the WAV analogue of ComfyUI's PNG text chunks.
"""

from __future__ import annotations

import json
import struct

from . import json_limits
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


def read_wav_comment(path: str) -> dict | None:
    """The JSON object in a WAV's ``LIST/INFO/ICMT`` chunk, or None."""
    with open(path, "rb") as handle:
        blob = handle.read()
    pos = 12
    while pos + 8 <= len(blob):
        tag, size = blob[pos:pos + 4], struct.unpack("<I", blob[pos + 4:pos + 8])[0]
        payload = blob[pos + 8:pos + 8 + size]
        if tag == b"LIST" and payload[:4] == b"INFO" and payload[4:8] == b"ICMT":
            text_size = struct.unpack("<I", payload[8:12])[0]
            return json_limits.loads(payload[12:12 + text_size].rstrip(b"\x00").decode("utf-8"))
        pos += 8 + size + (size % 2)
    return None
