"""Read a LoRA from disk: a single ``.safetensors`` file or a PEFT folder, safetensors only.

The header is validated by ``safetensors_header`` before any tensor is loaded; tensors are then read into memory
of their own (``_load_tensors``: never a mapping of the file, which a truncation would fault). Results are cached by resolved path and file identity
(``io.file_identity``) so a graph that uses one file in several branches reads it once; the cache is bounded by
bytes and evicts least-recently used.
A ``LoraFile`` from the cache is shared: callers (family ``prepare`` included) must build new objects, never
mutate it.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import OrderedDict

from ..errors import LoraFileError
from ..io import json_limits
from ..io.file_identity import file_identity, stat_identity
from ..io.safetensors_reads import read_all_owned
from .assembly import PeftScaling, assemble_targets
from .canonical import LoraFile
from .layouts import describe_format, parse_key, suffix_roles
from .safetensors_header import read_header

PEFT_CONFIG_NAME = "adapter_config.json"
PEFT_WEIGHTS_NAME = "adapter_model.safetensors"
# diffusers' save_lora_weights/save_lora_adapter embed the LoraConfig as JSON under this metadata key
DIFFUSERS_CONFIG_METADATA_KEY = "lora_adapter_metadata"
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl", ".pickle")
_TORCH_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}

CACHE_MAX_BYTES = 4 * 1024 ** 3
_cache: "OrderedDict[tuple, tuple[LoraFile, int]]" = OrderedDict()
_cache_lock = threading.Lock()


def read_lora(path: str) -> LoraFile:
    """Read ``path`` (a ``.safetensors`` file or a PEFT folder) into a ``LoraFile``; cached per file identity."""
    resolved = _peft_folder_of(os.path.realpath(os.fspath(path)))
    display_name = os.path.basename(resolved.rstrip(os.sep)) or resolved
    if not os.path.exists(resolved):
        raise LoraFileError(f"{display_name}: LoRA not found at {resolved}")
    files = _weight_files(resolved, display_name)
    identity = tuple(file_identity(f) for f in files)
    cache_key = (resolved, identity)
    with _cache_lock:
        hit = _cache.get(cache_key)
        if hit is not None:
            _cache.move_to_end(cache_key)
            return hit[0]
    lora = _read_uncached(resolved, display_name, identity)
    _remember(cache_key, lora)
    return lora


def _peft_folder_of(resolved: str) -> str:
    """``<folder>/adapter_model.safetensors`` next to an ``adapter_config.json`` is read as the folder: without
    the config its lora_alpha would be lost and the LoRA applied at the wrong scale."""
    folder = os.path.dirname(resolved)
    if (os.path.basename(resolved) == PEFT_WEIGHTS_NAME
            and os.path.isfile(os.path.join(folder, PEFT_CONFIG_NAME))):
        return folder
    return resolved


def clear_lora_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _weight_files(resolved: str, display_name: str) -> list:
    """The files whose identity keys the cache; refuses pickle formats and non-safetensors files."""
    if os.path.isdir(resolved):
        config = os.path.join(resolved, PEFT_CONFIG_NAME)
        weights = os.path.join(resolved, PEFT_WEIGHTS_NAME)
        if not os.path.isfile(weights):
            pickled = [n for n in sorted(os.listdir(resolved)) if n.endswith(PICKLE_SUFFIXES)]
            if pickled:
                raise LoraFileError(
                    f"{display_name}: the PEFT folder holds only {pickled[0]} (a pickle checkpoint); lorabind loads "
                    f"safetensors only. Convert it to {PEFT_WEIGHTS_NAME} (e.g. safetensors.torch.save_file on "
                    f"the loaded state dict, or peft's save_pretrained(safe_serialization=True)).")
            raise LoraFileError(f"{display_name}: not a PEFT adapter folder (it needs {PEFT_CONFIG_NAME} and "
                                f"{PEFT_WEIGHTS_NAME})")
        if not os.path.isfile(config):
            raise LoraFileError(f"{display_name}: PEFT folder has {PEFT_WEIGHTS_NAME} but no {PEFT_CONFIG_NAME}, "
                                f"so its lora_alpha and rank are unknown")
        return [config, weights]
    lowered = resolved.lower()
    if lowered.endswith(PICKLE_SUFFIXES):
        raise LoraFileError(
            f"{display_name}: pickle checkpoints ({os.path.splitext(lowered)[1]}) are refused because loading them "
            f"can run arbitrary code; convert the file to .safetensors (e.g. safetensors.torch.save_file on "
            f"torch.load(path, weights_only=True)).")
    if not lowered.endswith((".safetensors", ".sft")):  # ".sft": ComfyUI's short spelling, listed with them
        raise LoraFileError(f"{display_name}: not a .safetensors file; lorabind reads LoRAs in safetensors only")
    return [resolved]


def _read_uncached(resolved: str, display_name: str, identity: tuple) -> LoraFile:
    peft_folder = os.path.isdir(resolved)
    weights_path = os.path.join(resolved, PEFT_WEIGHTS_NAME) if peft_folder else resolved
    header = read_header(weights_path, display_name)
    metadata = dict(header.metadata)
    if peft_folder:
        config = _read_json(os.path.join(resolved, PEFT_CONFIG_NAME), display_name)
        metadata["adapter_config"] = config
        peft = PeftScaling.from_config(config, display_name)
    else:
        peft = _embedded_config(metadata, display_name)

    parsed, unknown = [], []
    for key in header.tensors:
        parsed_key = parse_key(key)
        (parsed if parsed_key is not None else unknown).append(parsed_key or key)
    if unknown and not parsed:
        raise LoraFileError(
            f"{display_name}: this is a model, not a LoRA: none of its {len(unknown)} tensors is a LoRA tensor "
            f"({', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}). Pick a LoRA file here, and load this "
            f"file with a model loader (UNETLoader, LoraBindCheckpointLoader)")
    if unknown:
        known = ", ".join(suffix for suffix, _ in suffix_roles())
        raise LoraFileError(
            f"{display_name}: {len(unknown)} tensor(s) are not LoRA tensors: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''} (known suffixes: {known})")
    if not parsed:
        raise LoraFileError(f"{display_name}: the file holds no tensors")

    tensors = _load_tensors(weights_path, display_name, list(header.tensors))
    targets = assemble_targets(parsed, tensors, display_name, peft)
    factor_dtypes = {_TORCH_DTYPE_NAMES.get(entry.dtype, entry.dtype)
                     for key, entry in header.tensors.items() if not key.endswith(".alpha")}
    return LoraFile(path=resolved, name=display_name, format=describe_format(parsed, peft_folder=peft_folder),
                    metadata=metadata, targets=targets, dtype="+".join(sorted(factor_dtypes)), identity=identity)


def _read_json(path: str, display_name: str) -> dict:
    try:
        data = json_limits.load_file(path)
    except (OSError, json.JSONDecodeError) as exc:
        raise LoraFileError(f"{display_name}: cannot read {os.path.basename(path)} ({exc})") from exc
    if not isinstance(data, dict):
        raise LoraFileError(f"{display_name}: {os.path.basename(path)} is not a JSON object")
    return data


def _embedded_config(metadata: dict, display_name: str):
    """diffusers files carry their LoraConfig in metadata, keys prefixed by component ("transformer.r")."""
    raw = metadata.get(DIFFUSERS_CONFIG_METADATA_KEY)
    if not raw:
        return None
    try:
        config = json_limits.loads(raw)
    except json.JSONDecodeError as exc:
        raise LoraFileError(f"{display_name}: metadata {DIFFUSERS_CONFIG_METADATA_KEY} is not JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise LoraFileError(f"{display_name}: metadata {DIFFUSERS_CONFIG_METADATA_KEY} is not a JSON object")
    unprefixed = {k.split(".", 1)[1] if k.startswith("transformer.") else k: v for k, v in config.items()}
    return PeftScaling.from_config(unprefixed, display_name)


def _load_tensors(weights_path: str, display_name: str, keys: list) -> dict:
    """Every tensor in memory of its own, never a view of a mapping of the file: a read LoRA is cached and its
    factors are fused again later (a strength change, a staged expert brought back), and a mapping would fault
    (SIGBUS) once the file is truncated and change once it is rewritten in place. Plain reads
    (``safetensors_reads.read_all_owned``: one read into one buffer); what that module does not read is copied out of
    ``safe_open``'s map."""
    from safetensors import SafetensorError, safe_open

    try:
        tensors = read_all_owned(weights_path, stat_identity(os.stat(weights_path)), keys)
        if tensors is None:
            with safe_open(weights_path, framework="pt", device="cpu") as handle:
                tensors = {key: handle.get_tensor(key).clone() for key in keys}
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise LoraFileError(f"{display_name}: safetensors could not load the tensors ({exc})") from exc
    _refuse_non_finite(tensors, display_name)
    return tensors


def _refuse_non_finite(tensors: dict, display_name: str) -> None:
    """NaN/Inf in a factor spreads through every fused weight it touches (a black image, non-finite merged
    files); name the tensors instead. (The header check already refused non-float dtypes.)"""
    import torch

    bad = [key for key, tensor in tensors.items() if not _all_finite(torch, tensor)]
    if bad:
        raise LoraFileError(f"{display_name}: tensor {bad[0]!r} holds NaN or infinite values"
                            + (f" ({len(bad) - 1} more tensors too)" if len(bad) > 1 else "")
                            + "; the file is broken")


def _all_finite(torch, tensor) -> bool:
    """One vectorised ``aminmax`` pass: a NaN anywhere makes both ends NaN, an Inf is an end itself. Why not
    ``isfinite(t).all()``: on bfloat16 it is an element-wise slow path, about 20x slower, and every LoRA read
    (each switch) pays it on every factor. fp8 factors have no ``aminmax`` kernel and keep ``isfinite``."""
    if tensor.numel() == 0:
        return True
    if tensor.element_size() == 1:
        return bool(torch.isfinite(tensor).all())
    low, high = torch.aminmax(tensor.reshape(-1))
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _remember(cache_key: tuple, lora: LoraFile) -> None:
    size = sum(_patch_bytes(p) for p in lora.targets.values())
    with _cache_lock:
        _cache[cache_key] = (lora, size)
        # drop older versions of the same path: a rewritten file must not keep its old tensors alive
        for stale in [k for k in _cache if k[0] == cache_key[0] and k != cache_key]:
            del _cache[stale]
        while len(_cache) > 1 and sum(s for _, s in _cache.values()) > CACHE_MAX_BYTES:
            _cache.popitem(last=False)


def _patch_bytes(patch) -> int:
    tensors = [t for deltas in patch.parameter_deltas().values() for delta in deltas for t in delta.tensors()]
    return sum(t.numel() * t.element_size() for t in tensors)
