"""A folder of safetensors shards read as one single file: LightX2V's native release layout
(``Wan2.2-T2V-A14B/high_noise_model/diffusion_pytorch_model-0000N-of-0000M.safetensors``, native key names, no
``model_index.json``), which its merger and extractor take as ``--source-model``.

Why here: the shards of such a folder are one denoiser in one key layout, split for size only; detection, the
single-file merge and the extractor ask the same questions of it as of one file (every key's shape and dtype, a
tensor by key, the metadata). ``read_folder_shapes`` answers the first from each shard's header through the reader
``detect`` hands it, ``ShardedSafetensors`` the others as ``safe_open`` would, opening the shard that holds a key.
safetensors only: a folder that holds pickle weights is refused, naming the file.
"""

from __future__ import annotations

import os
from typing import Callable

from ...errors import ModelLoadError
from ...lora.reader import PICKLE_SUFFIXES

INDEX_FILE = "model_index.json"  # a diffusers pipeline folder: not a shard folder
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
MAX_SHARDS = 256  # released denoisers come in at most a few dozen shards; a bound on what one folder may open


def is_shard_folder(path) -> bool:
    """A folder holding weight files directly and no ``model_index.json``."""
    return os.path.isdir(path) and not os.path.isfile(os.path.join(path, INDEX_FILE))


def shard_paths(folder: str, name: str) -> list[str]:
    """The folder's safetensors files, sorted; ModelLoadError naming a pickle file when it holds those instead
    (or as well: which of the two is the model cannot be told), or when it holds no weights."""
    names = sorted(os.listdir(folder))
    pickled = [n for n in names if n.lower().endswith(PICKLE_SUFFIXES)]
    if pickled:
        raise ModelLoadError(f"{name}/{pickled[0]}: pickle checkpoints are refused because loading them can run "
                             "arbitrary code; convert the weights to .safetensors first")
    shards = [os.path.join(folder, n) for n in names if n.endswith(SAFETENSORS_SUFFIXES)
              and os.path.isfile(os.path.join(folder, n))]
    if not shards:
        raise ModelLoadError(f"{name}: a folder without model_index.json and without .safetensors weights; give a "
                             "diffusers model folder, a folder of .safetensors shards or a single file")
    if len(shards) > MAX_SHARDS:
        raise ModelLoadError(f"{name}: {len(shards)} weight files, more than the {MAX_SHARDS} one model is split into")
    return shards


def read_folder_shapes(folder: str, name: str, read_one: Callable, want_metadata: bool = False):
    """``read_one``'s answer (``detect.read_shapes``) for the whole folder: every shard's keys together (a key in
    two shards is refused: which one is the weight cannot be told), or the first shard's metadata."""
    shards = shard_paths(folder, name)
    if want_metadata:
        return read_one(shards[0], f"{name}/{os.path.basename(shards[0])}", want_metadata=True)
    shapes, dtypes, owner = {}, {}, {}
    for path in shards:
        shard_name = f"{name}/{os.path.basename(path)}"
        part_shapes, part_dtypes = read_one(path, shard_name)
        twice = sorted(set(part_shapes) & set(shapes))
        if twice:
            raise ModelLoadError(f"{shard_name}: tensor {twice[0]!r} is in {owner[twice[0]]} as well")
        shapes.update(part_shapes)
        dtypes.update(part_dtypes)
        owner.update(dict.fromkeys(part_shapes, os.path.basename(path)))
    return shapes, dtypes


class ShardedSafetensors:
    """``safe_open``'s reading interface (``keys``, ``get_tensor``, ``get_slice``, ``metadata``) over a shard
    folder; each shard is opened once, when a key of it is first read."""

    def __init__(self, folder: str, name: str = ""):
        from safetensors import safe_open

        self._open = lambda path: safe_open(path, framework="pt")
        self._handles: dict = {}
        self._key_file: dict = {}
        self._shards = shard_paths(folder, name or os.path.basename(folder))
        for path in self._shards:
            for key in self._handle(path).keys():
                self._key_file[key] = path

    def _handle(self, path: str):
        if path not in self._handles:
            self._handles[path] = self._open(path)
        return self._handles[path]

    def keys(self):
        return list(self._key_file)

    def get_tensor(self, key: str):
        return self._handle(self._key_file[key]).get_tensor(key)

    def get_slice(self, key: str):
        return self._handle(self._key_file[key]).get_slice(key)

    def metadata(self):
        return self._handle(self._shards[0]).metadata()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._handles.clear()


def open_weights(path: str):
    """``safe_open`` of a file, or ``ShardedSafetensors`` of a shard folder: the same reading interface."""
    if os.path.isdir(path):
        return ShardedSafetensors(path)
    from safetensors import safe_open

    return safe_open(path, framework="pt")
