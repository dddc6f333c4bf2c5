"""Restoring a weight from the safetensors file it was loaded from, instead of keeping a RAM copy of it.

The patcher must restore every patched weight bit-exactly. A weight that was loaded unmodified from a safetensors
file can instead be re-read from that file, cast exactly as the loader cast it, when it has to be restored.

What proves a re-read exact (issue 26: no re-read of every byte at bind time):

* the file's identity (device, inode, size, mtime) when the weight is registered, checked again before every
  re-read and before anything is written;
* a digest (xxHash XXH3-128, memory speed) of the tensor as the loader cast it. The FILE side of it is computed
  once per (file identity, tensor, dtype) and cached for the process, so binding the same model again (another
  LoRA, another strength, after an unbind) reads nothing from disk; the LIVE side is hashed in memory at
  registration. Equal digests: the weight holds what the file holds, and the patcher keeps only the record;
  different ones: the weight was modified after loading, and keeps a RAM copy;
* a re-read, which happens only when a weight has to be rewritten (restore, switch, strength change) and only
  for the tensors touched, is hashed again and refused unless it matches: a file changed on disk (even in place,
  with the old mtime) is never used to "restore" different bytes. The patcher's re-reads go through one buffer
  per bind (``safetensors_reads``), not a ``safe_open`` per tensor.

``WeightSource`` is the record "this parameter came from ``key`` in ``file``, cast to ``load_dtype``". A loader
provides them through any object with ``lookup(component, state_key) -> WeightSource | None``;
``FolderWeightSources`` does it for a diffusers folder (each component's ``*.safetensors`` files and index). A
loader that renames keys or converts formats registers its own mapping the same way.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from ..errors import ModelLoadError
from . import json_limits
from .file_identity import stat_identity
from .safetensors_reads import ALIGNMENT, ReadBuffer, aligned_bytes, read_owned

# file digests kept per (file identity, tensor, dtype): 16 bytes each plus the key, so a whole 14B model's
# tensors fit many times over; the oldest are dropped past this count
MAX_CACHED_FILE_DIGESTS = 65536


class WeightSourceError(ModelLoadError):
    """A weight's original cannot be re-read exactly from the file it was loaded from (the file changed)."""


@dataclass(frozen=True)
class WeightSource:
    file: str  # absolute path of the .safetensors file
    key: str  # the tensor's name in that file
    load_dtype: Optional[torch.dtype] = None  # what the loader cast it to; None: the live parameter's dtype
    # (dim, start, stop): the weight is rows or columns start:stop along dim of the stored tensor (a tensor-parallel
    # rank's shard), re-read as that part alone; None: the whole tensor
    part: Optional[tuple] = None

    def shard(self, dim: int, start: int, stop: int) -> "WeightSource":
        """This source narrowed to the part a tensor-parallel rank holds."""
        return replace(self, part=(int(dim), int(start), int(stop)))

    def describe(self) -> str:
        """The tensor's name in messages, with its part: ``'blocks.0.ffn.2.weight' (columns 0:4480)``."""
        if self.part is None:
            return repr(self.key)
        dim, start, stop = self.part
        return f"{self.key!r} ({'rows' if dim == 0 else f'dimension {dim}'} {start}:{stop})"


@dataclass(frozen=True)
class FileIdentity:
    """What changes when a file is rewritten or replaced: inode, size, modification and change times (a rewrite
    in place that keeps the size and sets the mtime back still moves the ctime, which no user call can set)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str) -> "FileIdentity":
        return cls(*stat_identity(os.stat(path)))


def checksum(tensor: torch.Tensor) -> bytes:
    """XXH3-128 digest of a tensor's bytes (copied to the CPU first when it lives elsewhere). Why XXH3: it hashes
    at memory speed, where zlib's crc32 ran at about 0.5 GB/s and made restoring from the file slower than from
    RAM by 4-5x; it is a checksum against changed files, not a defence against a forger."""
    import xxhash

    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.to("cpu")
    if data.dim() == 2 and not data.is_contiguous() and data.stride(1) == 1:
        # a tensor-parallel rank's columns of a stored weight: its rows' bytes in order are the digest of the
        # contiguous tensor, hashed where they lie instead of copied out of the file first
        hasher = xxhash.xxh3_128()
        for row in data:
            hasher.update(row.view(torch.uint8).numpy())
        return hasher.digest()
    return xxhash.xxh3_128_digest(data.contiguous().reshape(-1).view(torch.uint8).numpy())


class _FileDigests:
    """Process-wide cache: (file identity, tensor key, dtype) -> (shape, digest) of that tensor as read and cast.
    A file replaced or rewritten gets a new identity, so its old digests are never looked up again."""

    def __init__(self):
        self._digests: "OrderedDict[tuple, tuple]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, source: "WeightSource", identity: "FileIdentity", dtype: torch.dtype) -> tuple:
        key = (source.file, identity, source.key, source.part, dtype)
        with self._lock:
            digest = self._digests.get(key)
            if digest is not None:
                self._digests.move_to_end(key)
                return digest
        value = read_tensor(source, dtype, None, identity)
        digest = (tuple(value.shape), checksum(value))
        del value
        with self._lock:
            self._digests[key] = digest
            while len(self._digests) > MAX_CACHED_FILE_DIGESTS:
                self._digests.popitem(last=False)
        return digest

    def clear(self) -> None:
        with self._lock:
            self._digests.clear()


file_digests = _FileDigests()


def read_tensor(source: WeightSource, dtype: torch.dtype, buffer: Optional[ReadBuffer] = None,
                identity: Optional["FileIdentity"] = None) -> torch.Tensor:
    """The tensor ``source`` names, read into a CPU tensor and cast to ``dtype``; never a mapping of the file (a
    staged weight re-read here is kept as the parameter: a mapping would fault when the file is truncated and
    change when it is rewritten, ``placement.file_pages``).

    With a ``buffer`` (and the file's ``identity``, just checked), read by plain reads into it
    (``safetensors_reads``): the result may be a view of the buffer, valid until its next read. Otherwise into
    memory of its own, at the alignment a mapping of the file would give it (``safetensors_reads.read_owned``; a
    tensor-parallel shard, ``source.part``, as its rows or its columns); a header that module does not read goes
    through ``safe_open``, copied out of its mapping at once.
    """
    if identity is None:
        identity = FileIdentity.of(source.file)
    if buffer is not None:
        value = buffer.read(source.file, identity, source.key, source.part)
    elif source.part is None:
        value = read_owned(source.file, identity, source.key)
    else:  # a shard: its rows, or its columns cut from the whole, in a buffer of this read's own
        value = ReadBuffer().read(source.file, identity, source.key, source.part)
    if value is not None:
        return value.to(dtype)
    from safetensors import safe_open

    with safe_open(source.file, framework="pt", device="cpu") as handle:
        if source.part is None:
            mapped = handle.get_tensor(source.key)
        else:  # a view of the file's mapping, columns strided
            stored = handle.get_slice(source.key)
            mapped = stored[part_index(source.part, stored.get_shape())]
        value = aligned_bytes(mapped.numel() * mapped.element_size(), mapped.data_ptr() % ALIGNMENT)
        value = value.view(mapped.dtype).view(mapped.shape).copy_(mapped)
        del mapped
    return value.to(dtype)


def part_index(part: tuple, shape) -> tuple:
    """The index of ``part`` (dim, start, stop) in a tensor of ``shape``; ``KeyError`` when it lies outside."""
    dim, start, stop = part
    if not (0 <= dim < len(shape) and 0 <= start < stop <= int(shape[dim])):
        raise KeyError(f"part {part} of a tensor of shape {list(shape)}")
    return (slice(None),) * dim + (slice(start, stop),)


@dataclass(frozen=True)
class FileBackedOriginal:
    """A parameter's original, kept as "re-read ``source``" plus what it takes to prove the re-read exact."""

    source: WeightSource
    identity: FileIdentity
    dtype: torch.dtype
    checksum: bytes  # XXH3-128 of the value as loaded
    nbytes: int

    @classmethod
    def register(cls, source: WeightSource, live: torch.Tensor) -> Optional["FileBackedOriginal"]:
        """The record, when the file's tensor cast like at load time has ``live``'s digest; None when it does
        not (the weight was modified after loading, or the mapping is wrong) or the file cannot be read. Reads
        the file only the first time this tensor of this file version is asked for (``file_digests``)."""
        dtype = source.load_dtype or live.dtype
        if dtype != live.dtype:
            return None
        try:
            identity = FileIdentity.of(source.file)
            expected = file_digests.get(source, identity, dtype)
        except Exception:  # unreadable or missing key: this weight keeps a RAM backup instead
            return None
        digest = checksum(live)
        if (tuple(live.shape), digest) != expected:
            return None
        return cls(source, identity, dtype, digest, live.numel() * live.element_size())

    def check_identity(self, label: str) -> None:
        """Raise before anything is written when the file is no longer the one the weight came from."""
        try:
            now = FileIdentity.of(self.source.file)
        except OSError as exc:
            raise WeightSourceError(self._gone(label, f"it cannot be read ({exc})")) from None
        if now != self.identity:
            raise WeightSourceError(self._gone(label, "it changed on disk since the weight was patched "
                                                      f"(size {self.identity.size} -> {now.size} bytes, or "
                                                      "rewritten in place)"))

    def read(self, label: str, buffer: Optional[ReadBuffer] = None) -> torch.Tensor:
        """The original value, re-read and proven identical to the registered one. With a ``buffer`` it may be a
        view of that buffer (``read_tensor``): use it before the next read through the same buffer."""
        self.check_identity(label)
        value = read_tensor(self.source, self.dtype, buffer, self.identity)
        if checksum(value) != self.checksum:
            raise WeightSourceError(self._gone(label, "its bytes differ from those the weight was loaded with"))
        return value.contiguous()

    def _gone(self, label: str, why: str) -> str:
        return (f"cannot restore {label} exactly from {shown_name(self.source.file)} (tensor "
                f"{self.source.describe()}): {why}. lorabind keeps no RAM copy of weights it can re-read from their "
                "file; reload the model.")


def shown_name(path: str) -> str:
    """A weight file as a message names it: its folder and name ("vae/diffusion_pytorch_model.safetensors"), never
    the absolute path (messages reach the browser and ``/history``)."""
    return "/".join(Path(path).parts[-2:])


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
                weight_map = json_limits.load_file(indexes[0])["weight_map"]
                return {key: str((folder / name).resolve()) for key, name in weight_map.items()}
            if len(files) == 1:
                from safetensors import safe_open

                with safe_open(str(files[0]), framework="pt", device="cpu") as handle:
                    return {key: str(files[0].resolve()) for key in handle.keys()}
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        return {}  # several candidate files (variants such as *.fp16.safetensors): not knowable which was loaded
