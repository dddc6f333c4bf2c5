"""Component sizes from configs, built on the meta device: no weight is read, nothing is allocated.

Why build the module instead of reading the safetensors headers: ``lorabind plan`` must answer for a folder
that holds only configs (the real configurations shipped in the pack) and for a dtype other than the stored
one; a module built on the meta device has exactly the parameters diffusers/transformers would load, and its
repeated blocks (``_no_split_modules``) tell how large one streamed block is.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError
from ..families import component_roles, real_config_names
from ..families.roles import (
    ROLE_ALTERNATE,
    ROLE_DENOISER,
    ROLE_HIGH_NOISE,
    ROLE_IMAGE_ENCODER,
    ROLE_LOW_NOISE,
    ROLE_TEXT_ENCODER,
)
from ..io import json_limits
from ..io.model_index import read_model_index
from ..io.shipped_configs import shipped_model_folder
from ..meta_modules import build_on_meta, component_class
from .sizes_cache import cached_components, cached_sizes, model_key, read_config_text, sizes_key

# The role vocabulary is the families' (``families.interface``); the planner groups components by it.
DENOISER_ROLES = (ROLE_DENOISER, ROLE_HIGH_NOISE, ROLE_LOW_NOISE)
ALTERNATE_ROLE = ROLE_ALTERNATE
EXPERT_ROLES = (ROLE_HIGH_NOISE, ROLE_LOW_NOISE)
ENCODER_ROLES = (ROLE_TEXT_ENCODER, ROLE_IMAGE_ENCODER)


@dataclass(frozen=True)
class ComponentSize:
    name: str  # the model_index component
    role: str  # its family's role for it (``families.interface.ROLE_*``)
    bytes: int  # weights at the dtype the component runs in
    largest_layer_bytes: int  # the largest single module holding parameters directly (e.g. one Linear)
    largest_block_bytes: int = 0  # the largest repeated block (the unit block-level offload streams)
    blocks_bytes: int = 0  # all repeated blocks together (the rest stays put under block offload)
    parameters: int = 0  # parameter count (published model sizes are quoted in parameters)
    # its weights can be re-read from its file, so a plan may keep it there while unused (``file_staging``);
    # GGUF denoisers cannot (their weights are not re-read from the GGUF file): held on the host instead
    file_backed: bool = True


def _component_class(library: str, class_name: str, where: Path):
    """The class a ``model_index`` entry names; a missing one (older diffusers/transformers) is a clear error."""
    try:
        return component_class(library, class_name)
    except (ImportError, AttributeError):
        raise ModelLoadError(f"{where}: {library}.{class_name} is not available in the installed {library}") from None


def resolve_model_source(model) -> Path:
    """A diffusers folder, or the folder of a shipped real configuration (``families.real_config_names``)."""
    names = real_config_names()
    if str(model) in names:
        return shipped_model_folder(str(model))
    folder = Path(model).expanduser()
    if not (folder / "model_index.json").is_file():
        raise ModelLoadError(f"{model}: neither a diffusers folder (no model_index.json) nor a known configuration "
                             f"({', '.join(names)})")
    return folder


def _read_config(folder: Path) -> str:
    config_file = folder / "config.json"
    try:
        text = read_config_text(config_file)
        config = json_limits.loads(text)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{config_file}: cannot be read: {exc}") from exc
    check_config_sizes(config, str(config_file))
    return text


# Bounds on what a config may ask to build, far above every real model (largest repeat count in the shipped
# configs: 80; largest width: 262144): building a module on the meta device costs Python time per layer, so
# ``num_layers: 200000`` took minutes and gigabytes before anything was planned.
MAX_REPEATS = 512  # integers named like a count of layers/blocks ("num_layers", "layers_per_block", "depth")
MAX_WIDTH = 1 << 20  # integers named like a width ("hidden_size", "vocab_size", "in_channels", ...)
MAX_LIST = 256  # list lengths ("block_out_channels" builds one block per entry)
_REPEAT_WORDS = frozenset({"layers", "blocks", "depth"})
_WIDTH_WORDS = frozenset({"size", "dim", "channels", "heads", "embeddings", "features", "vocab"})


def check_config_sizes(config, where: str, key: str = "") -> None:
    """``ModelLoadError`` naming the file and key for a number or list beyond the bounds above."""
    if isinstance(config, dict):
        for name, value in config.items():
            check_config_sizes(value, where, str(name))
    elif isinstance(config, list):
        if len(config) > MAX_LIST:
            raise ModelLoadError(f"{where}: {key} lists {len(config)} entries; at most {MAX_LIST} are accepted")
        for item in config:
            check_config_sizes(item, where, key)
    elif isinstance(config, int) and not isinstance(config, bool):
        words = set(key.lower().split("_"))
        bound = MAX_REPEATS if words & _REPEAT_WORDS and not words & _WIDTH_WORDS else MAX_WIDTH
        if (words & (_REPEAT_WORDS | _WIDTH_WORDS)) and not 0 <= config <= bound:
            raise ModelLoadError(f"{where}: {key} is {config}; a model this size is not planned (at most {bound})")


# GGUF quantizations ``plan --weights`` sizes, named as the published files are ("...-Q4_K_M.gguf" is mostly Q4_K)
GGUF_WEIGHTS = ("q8_0", "q6_k", "q5_k", "q5_0", "q4_k", "q4_0")
# how the weights are stored: ``fp8`` as ComfyUI's fp8 single files store them, a GGUF type as GGUF files do
WEIGHTS = ("bf16", "fp8") + GGUF_WEIGHTS
FP8_ROLES = DENOISER_ROLES + (ROLE_TEXT_ENCODER,)  # ComfyUI publishes fp8 files of these; VAEs stay bf16
GGUF_ROLES = DENOISER_ROLES  # GGUF denoisers come with safetensors text encoders and VAEs


def stored_as(role: str, weights: str) -> str:
    """How a component of ``role`` is stored when a model's ``weights`` are: GGUF files quantize the denoisers
    only, fp8 files the denoisers and the text encoder; everything else stays bf16."""
    return weights if role in (GGUF_ROLES if weights in GGUF_WEIGHTS else FP8_ROLES) else "bf16"


def stored_block_bytes(module, weights: str) -> dict:
    """{parameter name: bytes as stored} of the block matrices a file with ``weights`` stores below the compute
    dtype: fp8 files one byte per element; GGUF files the quantized bytes (``gguf.GGML_QUANT_SIZES``: bytes per
    block of values) of every block matrix whose rows divide into the type's blocks; the published converters
    leave the others (and everything outside the blocks) unquantized, so they are sized at the compute dtype."""
    parameters, matrices = dict(module.named_parameters()), block_matrices(module)
    if weights == "fp8":
        return {name: parameters[name].numel() for name in matrices}
    import gguf

    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[weights.upper()]]
    return {name: parameters[name].numel() // block_size * type_size for name in matrices
            if parameters[name].shape[-1] % block_size == 0}


@functools.lru_cache(maxsize=64)
def _measure_config(library: str, class_name: str, config_text: str, dtype_name: str, where: str,
                    weights: str = "bf16") -> dict:
    """Sizes of one component from its config; cached in memory and on disk (``sizes_cache``) because building a
    14B module on the meta device takes seconds of Python and a two-expert model (or a second ``plan``) asks for
    the same config again.
    ``weights``: "bf16", or how the file stores the repeated blocks' matrices (``stored_block_bytes``): "fp8"
    as ComfyUI's ``*_fp8_e4m3fn*.safetensors`` (norms, biases and embeddings not), a GGUF type."""
    def measure() -> dict:
        import torch

        module = _meta_module(library, class_name, config_text, where)
        keep = keep_fp32_modules(module) if library == "diffusers" else ()
        stored = stored_block_bytes(module, weights) if weights != "bf16" else {}
        return _measure(module, getattr(torch, dtype_name), keep, stored)

    return cached_sizes(sizes_key(library, class_name, config_text, dtype_name, weights), measure)


@functools.lru_cache(maxsize=8)
def _meta_module(library: str, class_name: str, config_text: str, where: str):
    """One component built on the meta device, kept: sizing it and planning its tensor-parallel split (``lorabind
    plan --parallel tp=N``) read the same module, and building a 14B one takes seconds. Read only, never changed."""
    return build_on_meta(_component_class(library, class_name, Path(where)), json.loads(config_text))


def keep_fp32_modules(module) -> tuple:
    """The module names diffusers keeps in float32 whatever the dtype (``_keep_in_fp32_modules``)."""
    return tuple(getattr(type(module), "_keep_in_fp32_modules", None) or ())


def denoisers_on_meta(model_source) -> tuple[dict, dict]:
    """``({component: denoiser built on the meta device}, model_index)`` of a diffusers folder or shipped
    configuration: what a tensor-parallel plan is applied to when no weight is loaded."""
    folder = resolve_model_source(model_source)
    model_index = read_model_index(folder)
    modules = {}
    for name, role in component_roles(model_index).items():
        if role in DENOISER_ROLES:
            library, class_name = model_index[name]
            modules[name] = _meta_module(library, class_name, _read_config(folder / name), str(folder / name))
    return modules, model_index


def block_matrices(module) -> frozenset:
    """Names of the 2-D weights inside the module's repeated blocks (``_no_split_modules``)."""
    block_classes = set(getattr(module, "_no_split_modules", None) or ())
    prefixes = [prefix for prefix, sub in module.named_modules() if type(sub).__name__ in block_classes]
    return frozenset(name for name, p in module.named_parameters()
                     if p.dim() == 2 and name.endswith(".weight") and any(name.startswith(f"{b}.") for b in prefixes))


def measure_module(name: str, role: str, module, dtype, keep_fp32: tuple = (),
                   stored_bytes: Optional[dict] = None, file_backed: bool = True) -> ComponentSize:
    """The ``ComponentSize`` of an already built (e.g. meta-device) module: loaders that build their modules
    from shipped configs (single files) size them the same way as a folder's. ``stored_bytes``: {parameter
    name: bytes} of the weights kept in memory as the file stores them (fp8 weights, GGUF blocks)."""
    return ComponentSize(name=name, role=role, file_backed=file_backed,
                         **_measure(module, dtype, keep_fp32, stored_bytes or {}))


def _measure(module, dtype, keep_fp32: tuple, stored_bytes: dict) -> dict:
    """Byte counts of ``module`` at ``dtype``; parameters named by ``keep_fp32`` stay float32 (as diffusers
    loads them), those in ``stored_bytes`` take the bytes given there."""
    import torch

    run_bytes = torch.empty((), dtype=dtype, device="meta").element_size()

    def nbytes(name: str, tensor, stored: bool = True) -> int:
        name = name.lstrip(".")  # a root module's own parameters come as ".name"
        if not tensor.is_floating_point():
            return tensor.numel() * tensor.element_size()
        if stored and name in stored_bytes:
            return stored_bytes[name]
        fp32 = any(part in keep_fp32 for part in name.split("."))
        return tensor.numel() * (4 if fp32 else run_bytes)

    total = sum(nbytes(n, p) for n, p in module.named_parameters())
    total += sum(nbytes(n, b) for n, b in module.named_buffers())
    parameters = sum(p.numel() for p in module.parameters())
    largest_layer = 0
    for prefix, sub in module.named_modules():
        # at the compute dtype even when stored fp8 or quantized: a forward dequantizes one layer at a time
        own = sum(nbytes(f"{prefix}.{n}", p, stored=False) for n, p in sub.named_parameters(recurse=False))
        largest_layer = max(largest_layer, own)
    block_classes = set(getattr(module, "_no_split_modules", None) or ())
    blocks = []
    seen = set()
    for prefix, sub in module.named_modules():
        if type(sub).__name__ in block_classes and not any(prefix.startswith(s + ".") for s in seen):
            seen.add(prefix)
            blocks.append(sum(nbytes(f"{prefix}.{n}", p) for n, p in sub.named_parameters()))
    return {"bytes": total, "largest_layer_bytes": largest_layer, "largest_block_bytes": max(blocks, default=0),
            "blocks_bytes": sum(blocks), "parameters": parameters}


def component_sizes(model_source, dtype="bfloat16", weights: str = "bf16") -> list[ComponentSize]:
    """Sizes of every weighted component of a diffusers folder or shipped configuration name
    (``model_index.json`` + per-component ``config.json``), at ``dtype`` (a name or ``torch.dtype``), built on
    the meta device; ``weights="fp8"`` sizes the denoisers and text encoders as fp8 files, a GGUF type
    (``GGUF_WEIGHTS``) the denoisers as GGUF files of that type (``WEIGHTS``)."""
    if weights not in WEIGHTS:
        raise ModelLoadError(f"weights {weights!r}: choose one of {list(WEIGHTS)}")
    dtype_name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")

    def measure() -> list[dict]:
        folder = resolve_model_source(model_source)
        model_index = read_model_index(folder)
        sizes = []
        for name, role in component_roles(model_index).items():
            library, class_name = model_index[name]
            stored = stored_as(role, weights)
            measured = _measure_config(library, class_name, _read_config(folder / name), dtype_name,
                                       str(folder / name), stored)
            sizes.append({"name": name, "role": role, "file_backed": stored not in GGUF_WEIGHTS, **measured})
        return sizes

    quick = _shipped_folder(model_source) or Path(model_source).expanduser()
    key = model_key(quick, dtype_name, weights)
    return [ComponentSize(**entry) for entry in cached_components(key, measure,
                                                                  lambda: model_key(quick, dtype_name, weights))]


def _shipped_folder(model_source) -> Path | None:
    """The folder of a shipped configuration found by its name alone, before the families are imported (they
    import torch): the first thing ``resolve_model_source`` looks for too, so a cache hit means the same folder."""
    return shipped_model_folder(str(model_source))
