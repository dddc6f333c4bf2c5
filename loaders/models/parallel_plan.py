"""``lorabind plan --parallel``: one rank's memory plan when a job of several ranks splits the model.

Why a planner of its own above ``placement``: the per-rank figures depend on how each split divides the model,
and a tensor-parallel split is the family's plan applied to the denoiser (``tensor_parallel``), which
``placement`` (below the models) cannot ask. Nothing is loaded: the denoisers are built on the meta device.

What each split does to one rank's figures (the assumptions, stated once):

* ``tp=N``: the parameters the family's plan splits take 1/N of their bytes on each rank; every other parameter
  (embeddings, norms, modulation tables, a rowwise layer's bias, the encoders and the VAE) stays whole. The
  denoising working memory stays the whole model's (``planner.default_activation_bytes`` of the unsplit
  denoisers): the residual stream and every rowwise layer's all-reduced output are full-size on each rank, only
  the attention and FFN intermediates shrink, so the whole figure is the safe one. Only ``memory=full`` combines
  with tp: the split keeps each shard on its rank's device, so a plan that moves the denoisers
  (``swap_experts``, ``offload_model``, ``offload_blocks``) is refused, as ``store.load`` refuses it at run
  time. Each rank reads only its shard while loading (``split_loading``), so the per-rank figures are also the
  peak while loading (plus one tensor being cast, the largest of a denoiser's).
* ``ulysses=N``, ``ring=N``: every rank holds the whole model; every plan combines with them. The working memory
  is taken as proportional to the tokens a rank holds, so it divides by ``ulysses x ring``.
* ``cfg=2``: every rank holds the whole model (with ``tp=N``: its pass's split) and runs one of a guided step's
  two passes; the passes are separate forwards of batch 1 already, so a rank's working memory does not change.
* Host: the ranks run on one machine (``lorabind run`` starts them there) and share its ``--ram``: each rank is
  planned with the usable ``--ram`` (less the OS's headroom, ``placement.headroom``) divided by the ranks. On a
  machine without a GPU (``device="cpu"``) the RAM is each rank's device: its share of the usable ``--ram`` is
  what the rank's figure (weights and working memory) must fit, as ``plan --device cpu`` plans one process.
  ``ulysses``/``ring``/``cfg`` alone are planned by ``placement.choices`` (every storage, as plain ``plan``);
  this module plans ``tp`` and ``--files``.
* What a tp rank holds beside its shards, whole (``tensor_parallel`` in ``--json``, per denoiser): the parameters
  the plan does not split (Wan: the patch, text and time embeddings, the norms, each block's modulation table, the
  rowwise layers' biases: 0.06 GiB at Wan2.1-1.3B, 0.5 GiB in an A14B expert), and every other component (the
  text encoder, the VAE). A LoRA fused into the shards adds no copy: each rank re-reads its shard's original from
  the file (``io.weight_sources``), as one process does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..distributed.spec import ParallelSpec
from ..errors import ModelLoadError
from ..families import detect_model_family, family_for_index
from ..placement.model_plan import plan_model
from ..placement.planner import (
    DEFAULT_DECODE_SIZE,
    GIB,
    MEMORY_PLANS,
    MemoryPlan,
    default_activation_bytes,
    plan_memory,
)
from ..placement.sizes import (
    DENOISER_ROLES,
    component_sizes,
    denoisers_on_meta,
    keep_fp32_modules,
    measure_module,
)
from .tensor_parallel import check_splittable, sharded_parameter_names

TP_PLANS = ("auto", "full")  # the --memory choices that keep the denoisers on the device, as a split needs


@dataclass(frozen=True)
class DenoiserShare:
    """One denoiser under ``tp=N``: bytes of the parameters split, of those kept whole, and on each rank."""

    component: str
    sharded_bytes: int
    whole_bytes: int
    per_rank_bytes: int

    def to_json(self) -> dict:
        return {"component": self.component, "sharded_bytes": self.sharded_bytes, "whole_bytes": self.whole_bytes,
                "per_rank_bytes": self.per_rank_bytes}


@dataclass(frozen=True)
class RankPlan:
    """One rank's plan (``plan``, over the per-rank ``sizes``) for ``spec``; under tp also the denoisers'
    shares."""

    spec: ParallelSpec
    plan: MemoryPlan
    sizes: list
    activation_bytes: int
    shares: tuple = ()
    on_cpu: bool = False  # planned on a machine without a GPU: the plan's device figures are RAM

    @property
    def fits(self) -> bool:
        return self.plan.fits


def plan_ranks(model, spec: ParallelSpec, *, vram_gib: float | None, ram_gib: float | None = None,
               memory: str = "auto", dtype: str = "bfloat16", weights: str = "bf16", sizes: list | None = None,
               device: str = "cuda", decode_size: tuple = DEFAULT_DECODE_SIZE) -> RankPlan:
    """One rank's memory plan for ``model`` (as ``placement.model_plan.plan_model`` takes it; ``sizes``: measured
    single files, refused under tp) split as ``spec`` says, each rank with ``vram_gib`` of device memory and a
    share of ``ram_gib``; on the CPU (``device="cpu"``, ``vram_gib`` unused) the share of ``ram_gib`` is all a rank
    has. ``decode_size``: the frames' (width, height) the VAE decodes (the planner's 720p by default). A tp split
    that cannot work raises ``ModelLoadError`` naming the family and the reason."""
    rank_ram = None if ram_gib is None else ram_gib / spec.world_size
    if device == "cpu":
        return _cpu_ranks(model, spec, rank_ram, memory, dtype, weights, sizes, decode_size)
    if spec.tp == 1:
        plan, sized = plan_model(model, vram_gib=vram_gib, ram_gib=rank_ram, memory=memory, dtype=dtype,
                                 weights=weights, sizes=sizes, sequence_split=spec.sequence, decode_size=decode_size)
        return RankPlan(spec, plan, sized, default_activation_bytes(sized) // spec.sequence)
    _check_tp_request(spec.tp, memory, weights, sizes)
    whole = component_sizes(model, dtype=dtype, weights=weights)
    shares, per_rank = _split_sizes(model, whole, spec.tp, dtype)
    activation = default_activation_bytes(whole)
    device, host = int(vram_gib * GIB), None if rank_ram is None else int(rank_ram * GIB)
    plan = plan_memory(per_rank, device_free_bytes=device, host_free_bytes=host, requested="full",
                       activation_bytes=activation, decode_size=decode_size)
    ranked = RankPlan(spec, _tp_reason(plan, spec.tp), per_rank, activation, shares)
    if ranked.fits:
        return ranked
    ulysses, _ = plan_model(model, vram_gib=vram_gib, ram_gib=rank_ram, dtype=dtype, sequence_split=spec.tp)
    if not ulysses.fits:
        return ranked
    hint = (f"with ulysses={spec.tp} on as many ranks (the whole model on each) memory={ulysses.memory} fits: peak "
            f"{ulysses.peak_device_bytes / GIB:.1f} GiB device, {ulysses.peak_host_bytes / GIB:.1f} GiB host per rank")
    return replace(ranked, plan=replace(ranked.plan, reason=f"{ranked.plan.reason}; {hint}"))


def _cpu_ranks(model, spec: ParallelSpec, rank_ram: float, memory: str, dtype: str, weights: str, sizes,
               decode_size: tuple) -> RankPlan:
    """A rank on a machine without a GPU: everything it holds is in its share of the RAM (memory=full, the only
    plan that keeps nothing twice there); its figure is the plan's device peak, the host's being the same memory."""
    if rank_ram is None:
        raise ModelLoadError(f"--device cpu --parallel {spec.describe()}: give --ram GIB, the machine's RAM the ranks "
                             f"share")
    if spec.tp > 1:
        _check_tp_request(spec.tp, memory, weights, sizes)
    elif memory not in TP_PLANS:
        raise ModelLoadError(f"--device cpu --parallel {spec.describe()} with --memory {memory}: on the CPU every "
                             f"rank keeps its model in RAM, planned as memory=full")
    whole = sizes if sizes is not None else component_sizes(model, dtype=dtype, weights=weights)
    shares, per_rank = _split_sizes(model, whole, spec.tp, dtype) if spec.tp > 1 else ((), whole)
    activation = default_activation_bytes(whole) // spec.sequence
    plan = plan_memory(per_rank, device_free_bytes=int(rank_ram * GIB), host_free_bytes=None, requested="full",
                       activation_bytes=activation, decode_size=decode_size)
    fits = "fits" if plan.fits else f"does not fit its {rank_ram:.1f} GiB share of the RAM"
    reason = (f"{spec.describe()} on the CPU: memory=full per rank, peak {plan.peak_device_bytes / GIB:.1f} GiB of "
              f"RAM{', while loading as after (each rank reads only its shard)' if spec.tp > 1 else ''}; {fits}")
    return RankPlan(spec, replace(plan, peak_host_bytes=0, reason=reason), per_rank, activation, shares, on_cpu=True)


def _check_tp_request(degree: int, memory: str, weights: str, sizes) -> None:
    """Refuses, by the flag, what tensor parallelism cannot combine with."""
    if sizes is not None:
        raise ModelLoadError(f"--parallel tp={degree} with --files: the split is planned from the model's own "
                             f"config; give the diffusers folder or a shipped configuration instead")
    if weights != "bf16":
        raise ModelLoadError(f"--parallel tp={degree} cannot split --weights {weights}: fp8 scales and GGUF blocks "
                             f"are laid out for the whole weight; plan bf16 weights (or use ulysses=/ring=/cfg=)")
    if memory not in TP_PLANS:
        moving = ", ".join(p for p in MEMORY_PLANS if p not in TP_PLANS)
        raise ModelLoadError(f"--parallel tp={degree} with --memory {memory}: each rank keeps its shard on its "
                             f"device, so only memory=full combines with tp ({moving} move the denoisers); "
                             f"ulysses=, ring= and cfg= combine with every plan")


def _split_sizes(model, whole: list, degree: int, dtype: str) -> tuple[tuple, list]:
    """The denoisers' shares and the per-rank component sizes: each split parameter at 1/degree of its bytes."""
    import torch

    modules, model_index = denoisers_on_meta(model)
    family, label = family_for_index(model_index), detect_model_family(model_index)
    run_dtype = getattr(torch, dtype)
    element = torch.empty((), dtype=run_dtype, device="meta").element_size()
    shares, per_rank = [], []
    for size in whole:
        if size.role not in DENOISER_ROLES:
            per_rank.append(size)
            continue
        module = modules[size.name]
        plan = family.sampling.tensor_parallel_plan(module)
        check_splittable(module, plan, degree, f"{label} '{size.name}'")
        parameters = dict(module.named_parameters())
        local = {name: parameters[name].numel() // degree * element
                 for name in sharded_parameter_names(module, plan, degree)}
        rank_size = measure_module(size.name, size.role, module, run_dtype, keep_fp32_modules(module), local,
                                   file_backed=size.file_backed)
        split_count = sum(parameters[name].numel() for name in local)
        rank_size = replace(rank_size, parameters=size.parameters - split_count + split_count // degree)
        sharded = split_count * element
        shares.append(DenoiserShare(size.name, sharded, size.bytes - sharded, rank_size.bytes))
        per_rank.append(rank_size)
    return tuple(shares), per_rank


def _tp_reason(plan: MemoryPlan, degree: int) -> MemoryPlan:
    """The per-rank plan with a reason that says the figures hold while loading too."""
    reason = (f"tp={degree}: memory=full per rank, peak {plan.peak_device_bytes / GIB:.1f} GiB device, "
              f"{plan.peak_host_bytes / GIB:.1f} GiB host, while loading as after (each rank reads only its shard)")
    if plan.fits:
        return replace(plan, reason=reason)
    host = "" if plan.host_free_bytes is None else f" / {plan.host_free_bytes / GIB:.1f} GiB host per rank"
    return replace(plan, reason=f"{reason}; does not fit on {plan.device_free_bytes / GIB:.1f} GiB device{host}")


def rank_plan_to_json(rank_plan: RankPlan) -> dict:
    """The ``parallel`` part of ``plan --json``: the spec, and how it divided the model."""
    spec = rank_plan.spec
    data = {"spec": {"ulysses": spec.ulysses, "ring": spec.ring, "cfg": spec.cfg, "tp": spec.tp,
                     "text": spec.describe()},
            "ranks": spec.world_size, "figures": "per rank", "device": "cpu" if rank_plan.on_cpu else "cuda",
            "activation_bytes": rank_plan.activation_bytes,
            "tensor_parallel": [share.to_json() for share in rank_plan.shares],
            "whole_on_every_rank_bytes": whole_on_every_rank(rank_plan)}
    return data


def whole_on_every_rank(rank_plan: RankPlan) -> dict:
    """{component: bytes} every rank of a tp split holds whole (empty without tp): a denoiser's parameters the plan
    does not split (embeddings, norms, modulation, rowwise biases), every other component whole (encoders, VAE)."""
    if not rank_plan.shares:
        return {}
    denoisers = {share.component: share.whole_bytes for share in rank_plan.shares}
    return {size.name: denoisers.get(size.name, size.bytes) for size in rank_plan.sizes}


def format_rank_lines(rank_plan: RankPlan) -> list[str]:
    """The lines ``plan --parallel`` prints above the per-rank plan."""
    spec = rank_plan.spec
    host_share = rank_plan.plan.device_free_bytes if rank_plan.on_cpu else rank_plan.plan.host_free_bytes
    shared = "" if host_share is None else f", each with {host_share / GIB:.1f} GiB of the machine's --ram usable"
    lines = [f"parallel: {spec.describe()} ({spec.world_size} ranks on one machine; the figures below are per rank"
             f"{shared})", f"working memory per rank: {rank_plan.activation_bytes / GIB:.1f} GiB"]
    for share in rank_plan.shares:
        lines.append(f"  {share.component}: {share.sharded_bytes / GIB:.2f} GiB split {spec.tp} ways, "
                     f"{share.whole_bytes / GIB:.2f} GiB whole on every rank -> {share.per_rank_bytes / GIB:.2f} GiB "
                     f"per rank")
    whole = whole_on_every_rank(rank_plan)
    if whole:
        parts = ", ".join(f"{name} {size / GIB:.2f}" for name, size in whole.items())
        lines.append(f"  whole on every rank: {sum(whole.values()) / GIB:.2f} GiB ({parts})")
    return lines
