"""Sequence parallelism (Ulysses / Ring) on a denoiser through diffusers' context parallelism.

diffusers splits a module's tokens across ranks where its ``_cp_plan`` says (and gathers them back), and replaces
the attention computation by Ulysses all-to-all or Ring passes. We apply it to any denoiser that declares a
``_cp_plan`` (diffusers 0.42 has them for the Wan, Qwen-Image and MiniMax-H3 transformers), never by family: a
family whose denoiser needs something else declares it on its own part. The weights stay whole on every rank,
so LoRA binding is unchanged (each rank binds the same patches; ``fingerprints`` checks it).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..errors import ModelLoadError
from . import quiet_parallel
from .process_group import job_mesh, session_spec
from .spec import ulysses_heads_refusal

MIN_DIFFUSERS_FOR_CONTEXT_PARALLEL = "0.36"  # ContextParallelConfig and ModelMixin.enable_parallelism
# Our attention options (loaders.placement.speed) whose diffusers backend supports context parallelism, and which
# of them Ring can use: Ring merges partial attentions by their log-sum-exp, which torch's native SDPA does not
# return, so native is Ulysses-only; flash3 and xformers are not context-parallel backends in diffusers at all.
ULYSSES_ATTENTION = ("native", "flash", "cudnn", "sage")
RING_ATTENTION = ("flash", "cudnn", "sage")


def ring_device_refusal(spec, device_type: str) -> str | None:
    """Why ``spec`` cannot run on ``device_type`` (None: it can): Ring needs a backend that returns its partial
    attention's log-sum-exp, and all of those run on CUDA only. Said as the way out (Ulysses), so the two checks
    (the backend's device, the split's backend) do not send a CPU user from one to the other and back."""
    if spec.ring == 1 or device_type == "cuda":
        return None
    return (f"--parallel {spec.describe()}: ring= runs on CUDA devices only (its attention backends "
            f"{', '.join(RING_ATTENTION)} need CUDA), and this job runs on {device_type}; there, split the sequence "
            f"with ulysses={spec.ring} instead (native attention)")


def check_attention(attention: str, device_type: str = "cuda") -> None:
    """Refuse, before loading, an attention backend the session's sequence split cannot run on, or a split the
    device cannot run at all."""
    spec = session_spec()
    if spec.sequence == 1:
        return
    refused = ring_device_refusal(spec, device_type)
    if refused:
        raise ModelLoadError(refused)
    usable = RING_ATTENTION if spec.ring > 1 else ULYSSES_ATTENTION
    if attention not in usable:
        mode = "ring" if spec.ring > 1 else "ulysses"
        raise ModelLoadError(f"--parallel {spec.describe()}: attention={attention} cannot run {mode} sequence "
                             f"parallelism; use one of {', '.join(usable)}")


def check_heads(heads: dict, label: str) -> None:
    """Refuse, before loading, a Ulysses degree the denoisers' heads ({component: heads}) cannot be shared by."""
    spec = session_spec()
    for component, count in heads.items():
        refusal = ulysses_heads_refusal(spec, int(count), f"{label} '{component}'")
        if refusal is not None:
            raise ModelLoadError(refusal)


def apply_sequence_parallel(denoisers: dict, device: torch.device) -> None:
    """Split every denoiser's sequence across the session's ring x ulysses ranks (nothing outside a split)."""
    spec = session_spec()
    if spec.sequence == 1:
        return
    config_class = _context_parallel_config_class()
    quiet_parallel.install()  # diffusers' "experimental feature" and timestep notices, on every rank
    mesh = job_mesh(torch.device(device).type)
    for name, module in denoisers.items():
        if getattr(module, "_cp_plan", None) is None or not hasattr(module, "enable_parallelism"):
            raise ModelLoadError(f"--parallel {spec.describe()}: {name} ({type(module).__name__}) declares no "
                                 "context-parallel plan (_cp_plan) in the installed diffusers, so its sequence "
                                 "cannot be split")
        config = config_class(ulysses_degree=spec.ulysses, ring_degree=spec.ring, mesh=mesh["ring", "ulysses"],
                              **_any_length(spec))
        with _cpu_counts_as_one_device():
            module.enable_parallelism(config=config)


def _any_length(spec) -> dict:
    """Token counts the degree does not divide: a prompt's text tokens (Qwen-Image's joint attention splits them
    too) or an odd latent size. diffusers splits those unevenly in its "anything" modes, one split kind at a time;
    with Ulysses and Ring both on, every split sequence must divide by their product."""
    if spec.ring == 1:
        return {"ulysses_anything": True}
    if spec.ulysses == 1:
        return {"ring_anything": True}
    return {}


def _context_parallel_config_class():
    try:
        from diffusers import ContextParallelConfig
    except ImportError:
        import diffusers

        raise ModelLoadError(f"sequence parallelism needs diffusers >= {MIN_DIFFUSERS_FOR_CONTEXT_PARALLEL} "
                             f"(ContextParallelConfig); diffusers {diffusers.__version__} is installed") from None
    return ContextParallelConfig


@contextmanager
def _cpu_counts_as_one_device():
    """diffusers (0.42, ``ModelMixin._resolve_parallel_config``) picks a rank's device as ``rank %
    torch.accelerator.device_count()``. Without an accelerator the count is 0 and that divides by zero, although
    every rank of a CPU job simply runs on ``cpu`` (gloo carries the collectives). So while a split is applied on a
    machine without an accelerator, the count reads 1 (device ``cpu:0``, the CPU); nothing else is changed. This
    is the one place the CPU case is handled."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    accelerator_count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = accelerator_count
