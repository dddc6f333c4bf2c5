"""Tensor parallelism of a model's denoisers: each rank of a group holds 1/N of every planned linear.

Why diffusers' machinery: its ``hooks.tensor_parallel`` turns a flat plan (``{"blocks.*.attn1.to_q": "colwise"}``)
into torch's ``ColwiseParallel``/``RowwiseParallel`` styles on DTensors, with the all-reduce after each rowwise
layer. Qwen-Image ships such a plan (``_tp_plan``); Wan's lives in its family package, in the same form, and
needs an ``adapt`` step (``TensorParallelPlan``). Which plan a denoiser gets is its family's answer
(``family.sampling.tensor_parallel_plan``), so this module names no family. ``store.load`` reads each denoiser
split (``split_loading``, which uses this module's checks, mesh and hooks); ``apply_tensor_parallel`` splits a
denoiser already in memory.

LoRA afterwards: the patcher recognises sharded parameters and fuses each rank's rows or columns only
(``binding.sharded_deltas``). So a model is split before anything is bound: a parameter patched before the split
keeps a full-size original that no longer matches its shard.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from torch import nn

from .. import fp8, gguf_weights
from ..binding.sharded_deltas import local_shard
from ..errors import ModelLoadError
from ..families import family_for

NEEDED_DIFFUSERS = "0.42"


@dataclass(frozen=True)
class ShardReport:
    """One denoiser's split: how many parameters are sharded, and their bytes on this rank against unsharded
    (``LoadedModel.tensor_parallel``; the sampler's report shows it, which only rank 0 writes)."""

    component: str
    sharded_parameters: int
    local_bytes: int
    full_bytes: int

    def to_dict(self) -> dict:
        return {"component": self.component, "split_parameters": self.sharded_parameters,
                "bytes_per_rank": self.local_bytes, "bytes_whole": self.full_bytes}


def apply_tensor_parallel(model, degree: int, group=None, only=None) -> list[ShardReport]:
    """Split the denoisers of ``model`` (a ``loaders.models.store.LoadedModel``) already in memory over ``degree``
    ranks: all of them, or the components named in ``only``.

    ``store.load`` reads each denoiser split instead (``split_loading``: a rank never holds the whole weights);
    this is for a denoiser a source read whole, and must run before any LoRA is bound. ``group``: the ranks that
    share the split (a ``torch.distributed`` process group whose size is ``degree``); None uses the default
    group. Every denoiser is checked first (plan, divisibility, state), so a refusal leaves the model whole; the
    errors name the family and the reason. Returns one ``ShardReport`` per denoiser split.
    """
    family = family_for(model)
    label = model.family  # the model family ("wan2.2_moe"), more precise than the family id
    _check_state(model, label)
    require_group(label, degree, group)
    components = {name: module for name, module in model.components.items() if only is None or name in only}
    plans = {name: family.sampling.tensor_parallel_plan(module) for name, module in components.items()}
    for name, module in components.items():
        check_splittable(module, plans[name], degree, f"{label} '{name}'")
    return [shard_denoiser(module, plans[name], group, name) for name, module in components.items()]


def require_process_group(label: str, degree: int) -> None:
    """Refuses ``--parallel tp=N`` in a process that has joined no ``torch.distributed`` job."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ModelLoadError(f"{label}: --parallel tp={degree} needs a torch.distributed process group; none is "
                             f"initialized on this process")


def require_group(label: str, degree: int, group=None) -> None:
    """Refuses ``--parallel tp=N`` outside a process group of N ranks (``group``, None: the default one)."""
    import torch.distributed as dist

    require_process_group(label, degree)
    size = dist.get_world_size(group if group is not None else dist.group.WORLD)
    if size != degree:
        raise ModelLoadError(f"{label}: --parallel tp={degree} needs a group of {degree} ranks, this one has {size}")


def shard_denoiser(module: nn.Module, plan, group, component: str = "") -> ShardReport:
    """Split one denoiser already in memory along ``plan`` over ``group`` (checked already:
    ``check_splittable``)."""
    import torch.distributed as dist

    device = next(module.parameters()).device
    group = group if group is not None else dist.group.WORLD
    split_with_hooks(module, plan, split_mesh(dist.get_world_size(group), group, device.type), device, component)
    return ShardReport(component, *_sharded_bytes(module))


def split_mesh(degree: int, group, device_type: str):
    """The one-dimensional ``tp`` mesh over ``group`` (None: the default group), which must have ``degree``
    ranks. A collective: every rank of the group builds it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    group = group if group is not None else dist.group.WORLD
    size = dist.get_world_size(group)
    if size != degree:
        raise ModelLoadError(f"--parallel tp={degree} needs a group of {degree} ranks, this one has {size}")
    return DeviceMesh.from_group(group, device_type, mesh_dim_names=("tp",))


def split_with_hooks(module: nn.Module, plan, mesh, device, component: str, already_split: bool = False) -> None:
    """diffusers' colwise/rowwise styles on ``module`` over ``mesh`` (splitting its planned weights, or only
    hooking them when ``already_split``: read split by ``split_loading``), then the plan's ``adapt``."""
    import torch.distributed as dist

    hooks, parallel = diffusers_parallel(component)
    config = parallel.TensorParallelConfig(mesh=mesh)
    recorded = parallel.ParallelConfig(tensor_parallel_config=config)
    recorded.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
    with _cpu_meshes_allowed(hooks, mesh.device_type):
        hooks.apply_tensor_parallel(module, config, plan.linears, weights_already_sharded=already_split)
    module._parallel_config = recorded  # what diffusers itself records: its other features refuse a split model
    if plan.adapt is not None:
        plan.adapt(module, mesh)


def check_splittable(module: nn.Module, plan, degree: int, label: str) -> None:
    """Refuses, touching nothing, a denoiser ``plan`` cannot split ``degree`` ways: the degree must divide the
    heads and every split dimension (the FFN width among them), and diffusers refuses what it knows cannot be
    split (quantized, offloaded or peft-wrapped modules)."""
    if getattr(module, "_parallel_config", None) is not None:
        raise ModelLoadError(f"{label}: --parallel tp={degree}: the denoiser is already split or parallel")
    compact = sorted(fp8.stored_weights(module)) + [n for n, p in module.named_parameters()
                                                   if gguf_weights.is_quantized(p)]
    if compact:
        raise ModelLoadError(f"{label}: --parallel tp cannot split weights stored as fp8 or GGUF ('{compact[0]}'): "
                             f"their scales and blocks are laid out for the whole weight; load the denoiser in "
                             f"bfloat16 or float16 to split it")
    if plan.heads % degree:
        raise ModelLoadError(f"{label}: --parallel tp={degree} must divide the denoiser's {plan.heads} attention "
                             f"heads (each rank runs whole heads)")
    hooks, parallel = diffusers_parallel(label)
    try:
        config = parallel.TensorParallelConfig(tp_degree=degree)
        hooks._check_tp_supported(type(module).__name__, plan.linears, None, config, model=module)
        hooks.resolve_tp_shard_specs(module, plan.linears, degree)
    except (ValueError, AttributeError) as exc:
        raise ModelLoadError(f"{label}: --parallel tp={degree} cannot split the denoiser: {exc}") from None


def sharded_parameter_names(module: nn.Module, plan, degree: int) -> frozenset:
    """Names of the parameters ``plan`` splits ``degree`` ways (checked already: ``check_splittable``); a rowwise
    layer's bias stays whole. Reads shapes only, so ``lorabind plan`` asks it of a denoiser on the meta device."""
    hooks, _ = diffusers_parallel(type(module).__name__)
    specs = hooks.resolve_tp_shard_specs(module, plan.linears, degree)
    return frozenset(name for name, spec in specs.items() if spec.dim is not None)


def _check_state(model, label: str) -> None:
    """Split a model as loaded: no LoRA bound yet (a fuse's original would be the whole weight, not the shard)
    and its denoisers resident on the device (a memory plan that moves them would move the shards' DTensors)."""
    state = getattr(model, "binding_state", None)
    if state is not None and (state.patcher.patched or state.adapters.entries):
        raise ModelLoadError(f"{label}: --parallel tp must split the model before any LoRA is bound (it has fused "
                             f"or attached LoRAs now)")
    placement = getattr(model, "placement", None)
    if placement is not None:
        check_plan_keeps_denoisers(placement.plan, list(model.components), label)


def check_plan_keeps_denoisers(plan, denoisers: list, label: str) -> None:
    """Refuse a memory plan (``placement.planner.MemoryPlan``) that moves a denoiser off the device: it would move
    the shards' DTensors. ``store.load`` asks this before any weight is read, so a refusal costs no load."""
    moved = {name: where for name in denoisers if (where := plan.placement.get(name, "device")) != "device"}
    if moved:
        raise ModelLoadError(f"{label}: --parallel tp keeps each rank's shard on its device, but the memory plan "
                             f"'{plan.memory}' places {moved}; use a plan that keeps the denoisers on the device")


def diffusers_parallel(label: str):
    """diffusers' tensor-parallel modules, imported on first use; a refusal naming the version when absent."""
    try:
        from diffusers.hooks import tensor_parallel as hooks
        from diffusers.models import _modeling_parallel as parallel
    except ImportError:
        import diffusers

        raise ModelLoadError(f"{label}: --parallel tp needs diffusers >= {NEEDED_DIFFUSERS} (its tensor "
                             f"parallelism); installed: {diffusers.__version__}") from None
    return hooks, parallel


@contextlib.contextmanager
def _cpu_meshes_allowed(hooks, device_type: str):
    """Lets diffusers split a denoiser on a ``cpu`` mesh, for this call only.

    Why: ``hooks.tensor_parallel._SUPPORTED_TP_DEVICES`` lists accelerators only and refuses ``cpu``, yet the
    DTensor styles it applies run over gloo on CPU exactly as over NCCL (the issue measured 2.4e-7 on Qwen-Image);
    CPU machines and the tests need it. This is the one place the refusal is lifted, and only for ``cpu``."""
    saved = hooks._SUPPORTED_TP_DEVICES
    if device_type == "cpu" and "cpu" not in saved:
        hooks._SUPPORTED_TP_DEVICES = (*saved, "cpu")
    try:
        yield
    finally:
        hooks._SUPPORTED_TP_DEVICES = saved


def _sharded_bytes(module: nn.Module) -> tuple[int, int, int]:
    """(count, bytes on this rank, bytes unsharded) of the module's parameters held as shards (a DTensor's
    ``numel`` is the whole tensor's)."""
    sharded = [(p, local_shard(p)) for p in module.parameters()]
    sharded = [(p, s) for p, s in sharded if s is not None]
    return (len(sharded), sum(s.local.numel() * s.local.element_size() for _, s in sharded),
            sum(p.numel() * p.element_size() for p, _ in sharded))
