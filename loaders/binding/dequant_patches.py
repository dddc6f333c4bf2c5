"""Fused LoRAs on GGUF-quantized layers: patches applied when the layer dequantises, never written into its bytes.

Why not fuse into the stored weight as for bf16/fp8: re-quantising ``dequant(Q) + Σ s·ΔW`` would round the LoRA
into the quantization grid (a Q4 grid step is larger than most LoRA deltas) and unbinding would need a backup of
the bytes. Instead the patcher gives the layer its patch list, and the layer computes, at each forward,
``W = dequant(Q) + Σ sᵢ·ΔWᵢ`` in float32 (each adapter kind's rows, as a fuse computes them:
``fused_rows.write_patched``) and casts it once to the compute dtype. The quantized bytes are never touched, so
unbinding only drops the patch list (and the hook): trivially exact.

Memory: one layer at a time. The patched weight exists only during its layer's forward (the layer's hook,
``forward_hooks.GGUF_PATCHES``, puts it in place of the GGUF parameter for the call and the parameter back after
it, also when the forward raises); at its peak a patched forward holds that layer's float32 dequantisation
and its compute-dtype value, where diffusers' own GGUF forward holds the dequantisation and its cast. Nothing
dequantised is cached per layer: a cache of patched weights would be the size of the unquantized model, which
is what GGUF is there to avoid. The cost is a float32 dequantise and one low-rank product per patched layer per
forward (``bench/bench_gguf_patches.py``).

Limitation: diffusers' optional CUDA GGUF kernels (``DIFFUSERS_GGUF_CUDA_KERNELS``, fetched from the hub) read
the parameter's ``quant_type`` in the forward; lorabind never downloads them, and a patched layer always runs the
plain dequantise-and-matmul path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

import torch

from .. import forward_hooks, gguf_weights
from ..lora.finite_bounds import largest_abs, proven_finite_for_any_weight
from .fused_rows import Workspace, write_patched

_workspaces = threading.local()  # one float32 row buffer per thread and device (``fused_rows.Workspace``)


@dataclass(frozen=True, eq=False)
class DequantPatch:
    """The contributions (``patching._Contribution``s) a quantized weight gets at dequantise time. The GGUF
    parameter itself stays where it is (``module.<name>``): a memory plan may move or replace it between
    forwards, and the patch follows whatever bytes the layer holds when it runs."""

    contributions: tuple
    # max|dequant(Q)|, what proves the patched value finite without a scan (finite_bounds); None where the
    # deltas alone prove it, whatever the weight
    abs_max: Optional[float]


def is_deferred(module: torch.nn.Module, name: str) -> bool:
    """True when ``module.<name>`` is patched at dequantise time (a GGUF-quantized weight)."""
    return gguf_weights.is_quantized(module._parameters.get(name))


@dataclass
class GgufPatches:
    """What the GGUF hook of one layer keeps: its patches, and the GGUF parameters set aside while it runs."""

    patches: dict = field(default_factory=dict)  # parameter name -> DequantPatch
    set_aside: dict = field(default_factory=dict)  # parameter name -> the GGUF parameter, during a forward


def set_patches(module: torch.nn.Module, name: str, contributions: tuple) -> None:
    """Give ``module.<name>`` exactly ``contributions`` (empty: none). A value that overflows the compute dtype is
    refused here, at bind time (``NonFiniteResultError``), not mid-run (``_checked_patch``). A layer left without
    patches loses its hook: it is as it was loaded."""
    state = forward_hooks.state_of(module, forward_hooks.GGUF_PATCHES)
    if not contributions:
        if state is not None:
            state.patches.pop(name, None)
            if not state.patches:
                forward_hooks.detach(module, forward_hooks.GGUF_PATCHES)
        return
    patch = _checked_patch(module, name, tuple(contributions))  # raises before anything is installed
    if state is None:
        state = GgufPatches()
        forward_hooks.attach(module, forward_hooks.GGUF_PATCHES, state, before=_patch_in, after=_put_back)
    state.patches[name] = patch


def _checked_patch(module: torch.nn.Module, name: str, contributions: tuple) -> DequantPatch:
    """The patch, once its value is known to stay finite in the compute dtype. Where the deltas alone prove it
    (``finite_bounds``: every ordinary LoRA), nothing is dequantised at bind: the patched value would be computed
    only to be thrown away, a float32 dequantise, a ``max|W|`` pass and a fuse's work per layer, which made a GGUF
    bind cost about twice a bf16 one (issue 47). Else the value is computed once here, so one that overflows is
    refused at bind time (``NonFiniteResultError``), not mid-run."""
    compute = _compute_dtype(module, torch.float32)
    if proven_finite_for_any_weight(compute, [(c.strength, d) for c in contributions for d in c.deltas]):
        return DequantPatch(contributions, None)
    base = gguf_weights.dequantize(module._parameters[name])
    patch = DequantPatch(contributions, largest_abs(base))
    _patched_value(patch, base, _compute_dtype(module, base.dtype))
    return patch


def patched_weight(module: torch.nn.Module, name: str, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The value ``module.<name>`` computes with now: ``dequant(Q) + Σ s·ΔW`` rounded once to the compute dtype."""
    state = forward_hooks.state_of(module, forward_hooks.GGUF_PATCHES)
    stored = state.set_aside.get(name, module._parameters[name])  # inside the forward: the set-aside bytes
    base = gguf_weights.dequantize(stored)
    return _patched_value(state.patches[name], base, dtype or _compute_dtype(module, base.dtype))


def _compute_dtype(module: torch.nn.Module, fallback: torch.dtype) -> torch.dtype:
    return getattr(module, "compute_dtype", None) or fallback


def _patched_value(patch: DequantPatch, base: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    workspace = getattr(_workspaces, "value", None)
    if workspace is None:
        workspace = _workspaces.value = Workspace()
    value = torch.empty(base.shape, dtype=dtype, device=base.device)
    write_patched(value, base, patch.contributions, workspace, original_abs_max=patch.abs_max)
    return value


def _patch_in(module, state: GgufPatches, args, kwargs):
    """Put each patched weight in place of its GGUF parameter for this forward (the layer's own dequantise
    leaves a plain tensor as it is); the parameter waits in ``set_aside``."""
    dtype = _compute_dtype(module, args[0].dtype) if args else None
    for name in state.patches:
        patched = patched_weight(module, name, dtype)
        state.set_aside[name] = module._parameters[name]
        module._parameters[name] = torch.nn.Parameter(patched, requires_grad=False)
    return args, kwargs


def _put_back(module, state: GgufPatches) -> None:
    for name, stored in state.set_aside.items():
        module._parameters[name] = stored
    state.set_aside.clear()
