"""Where a parameter's original value can be read again: the safetensors file it was loaded from.

Why: keeping an exact RAM copy of every patched weight costs as much host memory as the weights themselves (a
fused 14B expert held about 27 GB of backups). A weight that was loaded unmodified from a safetensors file can
instead be re-read from that file, cast exactly as the loader cast it, when it has to be restored. The patcher
registers such a weight only after checking, bit for bit, that the file's tensor (after the cast) equals the
live parameter; it then keeps just the file's identity and a checksum of the value, and every later re-read is
checked against both, so a file changed on disk is never used to "restore" different bytes.

``WeightSource`` is the record "this parameter came from ``key`` in ``file``, cast to ``load_dtype``". A loader
provides them through any object with ``lookup(component, state_key) -> WeightSource | None``;
``FolderWeightSources`` does it for a diffusers folder (each component's ``*.safetensors`` files and index). A
loader that renames keys or converts formats registers its own mapping the same way.
"""

from __future__ import annotations

import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..errors import ModelLoadError

_CHECKSUM_CHUNK = 64 * 1024 * 1024  # bytes per crc32 chunk; zlib releases the GIL, so chunks run in parallel
_CHECKSUM_THREADS = max(1, min(8, os.cpu_count() or 1))


class WeightSourceError(ModelLoadError):
    """A weight's original cannot be re-read exactly from the file it was loaded from (the file changed)."""


@dataclass(frozen=True)
class WeightSource:
    file: str  # absolute path of the .safetensors file
    key: str  # the tensor's name in that file
    load_dtype: Optional[torch.dtype] = None  # what the loader cast it to; None: the live parameter's dtype


@dataclass(frozen=True)
class FileIdentity:
    """What changes when a file is rewritten or replaced: inode, size, modification time."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str) -> "FileIdentity":
        st = os.stat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def checksum(tensor: torch.Tensor) -> tuple:
    """crc32 of a CPU tensor's bytes, per 64 MiB chunk (computed on several threads)."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    chunks = [data[start:start + _CHECKSUM_CHUNK] for start in range(0, max(1, data.size), _CHECKSUM_CHUNK)]
    if len(chunks) == 1:
        return (zlib.crc32(chunks[0]),)
    with ThreadPoolExecutor(_CHECKSUM_THREADS) as pool:
        return tuple(pool.map(zlib.crc32, chunks))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads and signed zeros included, unlike ``torch.equal`` on floats)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def read_tensor(source: WeightSource, dtype: torch.dtype) -> torch.Tensor:
    """The tensor ``source`` names, read into a CPU tensor and cast to ``dtype``.

    The file is opened for this one read: safetensors maps the file, and the pages a read touches count in the
    process's memory for as long as the mapping lives, so a handle kept open across a bind would grow by every
    tensor read through it.
    """
    from safetensors import safe_open

    with safe_open(source.file, framework="pt", device="cpu") as handle:
        value = handle.get_tensor(source.key)
    return value.to(dtype)


@dataclass(frozen=True)
class FileBackedOriginal:
    """A parameter's original, kept as "re-read ``source``" plus what it takes to prove the re-read exact."""

    source: WeightSource
    identity: FileIdentity
    dtype: torch.dtype
    checksum: tuple
    nbytes: int

    @classmethod
    def register(cls, source: WeightSource, live: torch.Tensor):
        """``(record, original)`` when the file's tensor, cast like at load time, equals ``live`` bit for bit;
        ``(None, None)`` when it does not (the weight was modified after loading, or the mapping is wrong)."""
        dtype = source.load_dtype or live.dtype
        try:
            identity = FileIdentity.of(source.file)
            value = read_tensor(source, dtype)
        except Exception:  # unreadable or missing key: this weight keeps a RAM backup instead
            return None, None
        if dtype != live.dtype or not _same_bits(value, live.detach().to("cpu") if live.device.type != "cpu" else live):
            return None, None
        record = cls(source, identity, dtype, checksum(value), value.numel() * value.element_size())
        return record, value

    def check_identity(self, label: str) -> None:
        """Raise before anything is written when the file is no longer the one the weight came from."""
        try:
            now = FileIdentity.of(self.source.file)
        except OSError as exc:
            raise WeightSourceError(self._gone(label, f"it cannot be read ({exc})")) from None
        if now != self.identity:
            raise WeightSourceError(self._gone(label, "it changed on disk since the weight was patched "
                                                      f"(size {self.identity.size} -> {now.size} bytes or a new "
                                                      "modification time)"))

    def read(self, label: str) -> torch.Tensor:
        """The original value, re-read and proven identical to the registered one."""
        self.check_identity(label)
        value = read_tensor(self.source, self.dtype)
        if checksum(value) != self.checksum:
            raise WeightSourceError(self._gone(label, "its bytes differ from those the weight was loaded with"))
        return value

    def _gone(self, label: str, why: str) -> str:
        return (f"cannot restore {label} exactly from {self.source.file} (tensor {self.source.key!r}): {why}. "
                "lorabind keeps no RAM copy of weights it can re-read from their file; reload the model.")


class FolderWeightSources:
    """``WeightSource``s of a diffusers folder: ``<folder>/<component>/`` holds the component's safetensors
    (one file, or shards listed by ``*.safetensors.index.json``), named by state-dict key."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self._maps: dict[str, dict[str, str]] = {}

    def lookup(self, component: str, state_key: str) -> Optional[WeightSource]:
        if component not in self._maps:
            self._maps[component] = self._component_map(self.folder / component)
        file = self._maps[component].get(state_key)
        return WeightSource(file=file, key=state_key) if file else None

    @staticmethod
    def _component_map(folder: Path) -> dict[str, str]:
        """state key -> file; empty (every weight then keeps a RAM backup) when the layout is not recognised."""
        if not folder.is_dir():
            return {}
        indexes = sorted(folder.glob("*.safetensors.index.json"))
        files = sorted(folder.glob("*.safetensors"))
        try:
            if len(indexes) == 1:
                weight_map = json.loads(indexes[0].read_text(encoding="utf-8"))["weight_map"]
                return {key: str((folder / name).resolve()) for key, name in weight_map.items()}
            if len(files) == 1:
                from safetensors import safe_open

                with safe_open(str(files[0]), framework="pt", device="cpu") as handle:
                    return {key: str(files[0].resolve()) for key in handle.keys()}
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            return {}
        return {}  # several candidate files (variants such as *.fp16.safetensors): not knowable which was loaded
