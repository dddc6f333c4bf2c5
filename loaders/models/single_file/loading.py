"""Build diffusers/transformers modules from single files, streaming each tensor to its place.

The module is created with its parameters on the meta device (``loaders.meta_modules``, as diffusers' own
``from_single_file`` does; buffers computed at construction, like rotary tables, stay real), then every
tensor is read from the file, renamed/split by the component's layout and assigned as the parameter itself.
Peak memory is the model plus one tensor, never the checkpoint twice. Why not ``from_single_file``: it loads
the whole checkpoint into a state dict, converts it (a second copy for renamed tensors) and always casts fp8 up.

Files are read through ``safetensors.safe_open`` (mmap), re-opened every ``_BATCH_BYTES`` so the pages already
copied out are unmapped: a mapping kept open for the whole load would count the full file in the process's
resident memory on top of the model.

dtypes: a bf16/fp16/fp32 file loads in ``dtype`` (default bfloat16) except the parameters the model class keeps
in float32 (``_keep_in_fp32_modules``), exactly as ``from_pretrained(dtype=...)`` does. fp8 weights stay fp8 (see
``fp8``), except in those keep-in-float32 modules (their callers cast inputs to the weight dtype), which are
dequantized on load; the rest of an fp8 file loads like a bf16 one.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from ... import fp8
from ...errors import ModelLoadError
from ...io.safetensors_reads import stored_bytes
from ...meta_modules import build_on_meta
from . import catalog
from .detect import Detected
from .native_files import keeps_fp32

_BATCH_BYTES = 256 * 1024 * 1024
# A denoiser read split (tensor parallelism) keeps no view of its split tensors' reads (``split_loading.owned``),
# so each batch's mapping goes when it closes; while it is open it holds every page read through it, the other
# ranks' columns of each rowwise weight included. Smaller batches bound that to about one large tensor, for a
# header read per batch.
SPLIT_BATCH_BYTES = 64 * 1024 * 1024
_IGNORED_KEYS = (fp8.SCALED_MARKER, "spiece_model")


def build_empty(detected: Detected):
    """The component's module from its shipped config, parameters on the meta device."""
    return build_on_meta(catalog.model_class(detected.kind), detected.config)


def owner(root, dotted: str):
    module_path, _, leaf = dotted.rpartition(".")
    return (root.get_submodule(module_path) if module_path else root), leaf


def _assign(root, key: str, tensor) -> None:
    import torch

    module, leaf = owner(root, key)
    if leaf in module._parameters:
        module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
    elif leaf in module._buffers:
        module._buffers[leaf] = tensor
    else:
        raise KeyError(key)


def batches(sizes: dict, limit: int = _BATCH_BYTES):
    """Keys in groups of about ``limit`` bytes ({key: bytes} in reading order): one file mapping per group."""
    batch, total = [], 0
    for key, size in sizes.items():
        batch.append(key)
        total += size
        if total >= limit:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


def _scale_key(native_key: str, keys) -> Optional[str]:
    stem = native_key[: -len(".weight")]
    return next((stem + s for s in fp8.SCALE_SUFFIXES if stem + s in keys), None)


def load_component(detected: Detected, *, dtype=None, fp8_rounding: str = "nearest", start_split=None):
    """The module for one detected file; ``ModelLoadError`` naming the file and key on any mismatch.
    ``fp8_rounding``: how later fuses round into its fp8 weights (``fp8.ROUNDINGS``). ``start_split``: under
    tensor parallelism, ``start_split(module on meta) -> split_loading.SplitDenoiser``, through which each
    tensor is read as this rank's part (a denoiser)."""
    import torch
    from safetensors import safe_open

    compute = dtype or torch.bfloat16
    model = build_empty(detected)
    splitting = start_split(model) if start_split is not None else None
    layout = detected.kind.layout(detected.config)
    plan = layout.native_plan(model.state_dict(keep_vars=True))
    keep = fp32_modules(type(model), detected, compute)
    # modules whose callers cast their input to the weight's dtype (umt5's ``wo``): an fp8 weight there is
    # dequantized on load instead of kept fp8
    never_fp8 = tuple(getattr(type(model), "_keep_in_fp32_modules", None) or ())
    with _reading(detected), safe_open(detected.path, framework="pt") as handle:
        file_keys = set(handle.keys())
        sizes = {k: stored_bytes(handle.get_slice(k)) for k in file_keys}
    prefix = detected.prefix
    native_keys = check_file_keys(detected, file_keys, plan, layout)
    order = {k: sizes[prefix + k] for k in plan if k in native_keys}
    for batch in batches(order) if splitting is None else splitting.read_groups(order, plan.__getitem__):
        with _reading(detected), safe_open(detected.path, framework="pt") as handle:
            for native_key in batch:
                if splitting is not None:
                    _take_split(splitting, handle, detected, layout, native_key, plan[native_key], compute, keep)
                    continue
                tensor = handle.get_tensor(prefix + native_key)
                scale_key = _scale_key(native_key, native_keys) if tensor.dtype == torch.float8_e4m3fn else None
                scale = fp8.checked_scale(handle.get_tensor(prefix + scale_key), detected.name,
                                          prefix + scale_key) if scale_key else None
                if tensor.dtype == torch.float8_e4m3fn:
                    fp8.refuse_nan(tensor, detected.name, prefix + native_key)
                for key, part in layout.split(native_key, tensor, plan[native_key]).items():
                    if part.dtype == torch.float8_e4m3fn and keeps_fp32(key, never_fp8):
                        part, scale_here = fp8.dequantize(part, scale, torch.float32), None
                    else:
                        scale_here = scale
                    place(model, key, part, scale_here, compute, keeps_fp32(key, keep), detected, fp8_rounding)
    if splitting is not None:
        return splitting.finish(detected.name)
    _tie_missing(model, detected, layout, native_keys)
    check_all_loaded(model, detected)
    return model.eval().requires_grad_(False)


def _take_split(splitting, handle, detected: Detected, layout, native_key: str, keys: tuple, compute, keep) -> None:
    """One native tensor into a denoiser read split: a tensor that is one diffusers parameter is read as this
    rank's rows or columns only; a fused one (none in today's denoiser layouts) is read whole and split right
    after, so at most one whole tensor is ever held."""
    import torch

    name = detected.prefix + native_key
    if layout.fused_rule(native_key) is None:
        parts = {keys[0]: handle.get_slice(name)}
    else:
        parts = layout.split(native_key, handle.get_tensor(name), keys)
    for key, part in parts.items():
        splitting.take(key, part, torch.float32 if keeps_fp32(key, keep) else compute, detected.name)


def refuse_split(detected: Detected) -> None:
    """Tensor parallelism cannot split a GGUF denoiser's quantized blocks nor an fp8 file's weights (each scale or
    block belongs to the whole weight): refused naming the file, from its header, before anything is loaded."""
    from safetensors import safe_open

    if detected.is_gguf:
        raise ModelLoadError(f"{detected.name}: --parallel tp cannot split a GGUF denoiser: its quantized blocks "
                             f"are laid out for the whole weight; use a bfloat16 or float16 file, or "
                             f"ulysses=/ring=/cfg= parallelism")
    with _reading(detected), safe_open(detected.path, framework="pt") as handle:
        stored = next((k for k in sorted(handle.keys()) if k.startswith(detected.prefix)
                       and handle.get_slice(k).get_dtype() == "F8_E4M3"), None)
    if stored is not None:
        raise ModelLoadError(f"{detected.name}: --parallel tp cannot split weights stored as fp8 ('{stored}'): "
                             f"their scales are laid out for the whole weight; use a bfloat16 or float16 file of "
                             f"this denoiser, or ulysses=/ring=/cfg= parallelism")


def check_file_keys(detected: Detected, file_keys, plan: dict, layout) -> set:
    """The file's keys without its prefix, when they are exactly the model's (``plan``: native key -> diffusers
    keys), less what is ignored or tied; else ``ModelLoadError`` naming the file and a few keys."""
    prefix = detected.prefix
    native_keys = {k[len(prefix):] for k in file_keys if k.startswith(prefix)}
    unexpected = sorted(k for k in native_keys - set(plan) if not ignored_key(k, layout))
    if unexpected:
        raise ModelLoadError(f"{detected.name}: {len(unexpected)} tensor(s) this {detected.title} does not have, "
                             f"e.g. {unexpected[:3]} (a different model or layout)")
    missing = sorted(k for k in plan if k not in native_keys and not _tied(k, layout, detected))
    if missing:
        raise ModelLoadError(f"{detected.name}: missing {len(missing)} tensor(s) of {detected.title}, "
                             f"e.g. {missing[:3]} (truncated or a different variant)")
    return native_keys


def check_all_loaded(model, detected: Detected) -> None:
    """``ModelLoadError`` when a parameter is still on the meta device after the file was read."""
    leftover = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if leftover:
        raise ModelLoadError(f"{detected.name}: no tensor for {leftover[:3]} of {detected.title}")


@contextlib.contextmanager
def _reading(detected: Detected):
    """The safetensors library's own errors (a file changed or damaged after detection) as a ``ModelLoadError``
    naming the file; its bare messages name neither the file nor the tensor."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as exc:
        raise ModelLoadError(f"{detected.name}: cannot be read as safetensors ({exc}); the file is damaged or "
                             "truncated") from None


def fp8_parameters(detected: Detected, model) -> set:
    """The diffusers parameter names ``load_component`` keeps in fp8 for this file (its fp8 tensors, less the
    modules it dequantizes): read from the file's header only, so a plan sizes them at one byte each."""
    from safetensors import safe_open

    layout = detected.kind.layout(detected.config)
    plan = layout.native_plan(model.state_dict(keep_vars=True))
    parameters = {name for name, _ in model.named_parameters()}
    never_fp8 = tuple(getattr(type(model), "_keep_in_fp32_modules", None) or ())
    with safe_open(detected.path, framework="pt") as handle:
        fp8_native = {k[len(detected.prefix):] for k in handle.keys()
                      if k.startswith(detected.prefix) and handle.get_slice(k).get_dtype() == "F8_E4M3"}
    return {key for native_key in fp8_native & set(plan) for key in plan[native_key]
            if key in parameters and not keeps_fp32(key, never_fp8)}


def fp32_modules(cls, detected: Detected, compute) -> tuple:
    """What ``from_pretrained`` keeps in float32: diffusers for any lower dtype; transformers only for float16
    (plus its ``_strict`` list always)."""
    import torch

    keep = tuple(getattr(cls, "_keep_in_fp32_modules", None) or ())
    if detected.kind.library == "diffusers":
        return keep
    strict = tuple(getattr(cls, "_keep_in_fp32_modules_strict", None) or ())
    return strict + (keep if compute == torch.float16 else ())


def ignored_key(native_key: str, layout) -> bool:
    """File keys that hold no parameter: fp8 scales and markers, the tokenizer blob, tensors diffusers
    recomputes (shared by the loader and ``extract``'s single-file reader)."""
    return (native_key in _IGNORED_KEYS or native_key in layout.native_only
            or native_key.endswith(fp8.SCALE_SUFFIXES + fp8.IGNORED_SUFFIXES))


def _tied(native_key: str, layout, detected: Detected) -> bool:
    """A key the file's kind lets it leave out (Qwen2.5-VL's ``lm_head``: text encoding never uses it), tied to
    the embeddings then."""
    return native_key in detected.kind.tied_to_embeddings


def _tie_missing(model, detected: Detected, layout, native_keys) -> None:
    """Tied copies the files leave out (umt5's ``encoder.embed_tokens`` is ``shared``) and the keys the kind lets
    a file leave out (a missing lm_head)."""
    for key in layout.diffusers_only:
        module, leaf = owner(model, key)
        if module._parameters[leaf].device.type == "meta":
            module._parameters[leaf] = model.get_input_embeddings().weight
    for native_key in detected.kind.tied_to_embeddings:
        if native_key not in native_keys:
            module, leaf = owner(model, layout.to_diffusers(native_key))
            setattr(module, leaf, model.get_input_embeddings().weight)


def place(model, key: str, tensor, scale, compute, keep_fp32: bool, detected: Detected, rounding: str) -> None:
    import torch

    module, leaf = owner(model, key)
    current = module._parameters.get(leaf)
    if current is None and leaf not in module._buffers:
        raise ModelLoadError(f"{detected.name}: {key} is not a tensor of {detected.title}")
    expected_shape = tuple((current if current is not None else module._buffers[leaf]).shape)
    if tuple(tensor.shape) != expected_shape:
        raise ModelLoadError(f"{detected.name}: {key} has shape {tuple(tensor.shape)}, {detected.title} expects "
                             f"{expected_shape}")
    if tensor.dtype == torch.float8_e4m3fn and current is not None:
        fp8.keep_fp8(module, leaf, tensor, scale, compute, rounding)
        return
    target = torch.float32 if keep_fp32 else compute
    _assign(model, key, tensor.to(target) if tensor.is_floating_point() else tensor)
