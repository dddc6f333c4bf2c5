"""Loading a denoiser already split for tensor parallelism: each rank reads only its rows or columns.

Why: splitting after a whole load (``tensor_parallel.apply_tensor_parallel`` on a loaded model) makes every rank
hold the whole denoiser first, so the memory a split saves is not saved while loading, which is exactly when a
28 GB expert does not fit a 24 GB GPU. Here the denoiser is built on the meta device, the family's plan says which
parameters split along which dimension (``resolve_tp_shard_specs`` reads shapes only), and each planned tensor
is read through a safetensors slice: ``get_slice(name)[rows]`` for a colwise weight and bias, ``[:, columns]``
for a rowwise weight; the rest (embeddings, norms, modulation, a rowwise bias) is read whole on every rank. The
slice is the only copy a rank ever holds of a split tensor, so its peak for the split linears is 1/N of them.

Why not diffusers' own ``from_pretrained(parallel_config=...)``, which streams the same way: it takes the plan
from the class (``_tp_plan``; Wan's plan is ours, in its family package), derives the device from
``torch.accelerator.device_count()`` (0 on a CPU machine: a division by zero) and reads diffusers' key names
only, where a single file needs its layout's renames. Its slicing rule (``_local_shard``, which cuts a
safetensors slice or a tensor alike) and its hook registration for weights already split
(``apply_tensor_parallel(weights_already_sharded=True)``) are used as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from ..errors import ModelLoadError
from ..io import json_limits
from ..io.safetensors_reads import stored_bytes
from ..meta_modules import build_on_meta, component_class
from .single_file.loading import SPLIT_BATCH_BYTES, batches
from .tensor_parallel import ShardReport, check_splittable, diffusers_parallel, split_mesh, split_with_hooks


@dataclass
class SplitLoad:
    """One load under ``--parallel tp=N``: the ``device`` the shards live on and the ranks' one-dimensional
    ``tp`` mesh (None: one over the default group, whose size must be ``degree``, built on first use: a
    collective). ``reports``: one ``ShardReport`` per denoiser loaded."""

    degree: int
    device: Any
    tp_mesh: Any = None
    reports: dict = field(default_factory=dict)

    def mesh(self):
        if self.tp_mesh is None:
            self.tp_mesh = split_mesh(self.degree, None, torch.device(self.device).type)
        return self.tp_mesh

    def start(self, module: nn.Module, family, label: str, component: str) -> "SplitDenoiser":
        """Begin loading ``module`` (built on the meta device) split by its family's plan. Refuses, before any
        weight is read, what the plan cannot split (naming the family, the component and the reason)."""
        plan = family.sampling.tensor_parallel_plan(module)
        check_splittable(module, plan, self.degree, f"{label} '{component}'")
        hooks, _ = diffusers_parallel(label)
        specs = hooks.resolve_tp_shard_specs(module, plan.linears, self.degree)
        return SplitDenoiser(self, module, plan, specs, component)


class SplitDenoiser:
    """One denoiser being filled tensor by tensor (``take``), then given its hooks (``finish``)."""

    def __init__(self, load: SplitLoad, module: nn.Module, plan, specs: dict, component: str):
        self.load, self.module, self.plan, self.specs, self.component = load, module, plan, specs, component
        self.expected = {name: tuple(t.shape) for name, t in module.state_dict(keep_vars=True).items()}
        self.local_bytes = 0  # bytes of the split parameters this rank holds, as loaded
        self.whole_bytes = 0  # their bytes unsplit

    def take(self, key: str, source, dtype, where: str) -> None:
        """Place parameter or buffer ``key`` from ``source`` (a safetensors slice, or a tensor already read),
        cast to ``dtype`` (None: as stored): this rank's rows or columns when the plan splits it, else whole."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        shape = tuple(source.get_shape()) if hasattr(source, "get_shape") else tuple(source.shape)
        if key not in self.expected:
            raise ModelLoadError(f"{where}: {key} is not a tensor of the {type(self.module).__name__}")
        if shape != self.expected[key]:
            raise ModelLoadError(f"{where}: {key} has shape {shape}, the model expects {self.expected[key]}")
        spec = self.specs.get(key)
        mesh = self.load.mesh()
        split = self.splits(key)
        if split:
            hooks, _ = diffusers_parallel(self.component)
            tensor = owned(hooks._local_shard(source, spec.dim, spec.block_sizes, mesh), dtype)
        else:  # held whole, as one process holds it: the file's pages, until a cast or a fuse writes it
            tensor = source if torch.is_tensor(source) else source[...]
            tensor = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
        if split:
            self.local_bytes += tensor.numel() * tensor.element_size()
            self.whole_bytes += math.prod(shape) * tensor.element_size()
        tensor = tensor.to(self.load.device)
        if spec is not None:  # a rowwise bias stays whole, yet as a DTensor beside its split weight
            placement = Replicate() if spec.dim is None else Shard(spec.dim)
            tensor = DTensor.from_local(tensor, mesh, [placement], run_check=False)
        owner_path, _, leaf = key.rpartition(".")
        owner = self.module.get_submodule(owner_path) if owner_path else self.module
        if leaf in owner._parameters:
            owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
        else:
            owner._buffers[leaf] = tensor

    def splits(self, key: str) -> bool:
        """Whether the plan splits parameter ``key`` (this rank reads its part) or every rank holds it whole."""
        spec = self.specs.get(key)
        return spec is not None and spec.dim is not None

    def read_groups(self, sizes: dict, parameters=lambda key: (key,)) -> list:
        """The file's keys (``sizes``: key -> stored bytes, in reading order; ``parameters(key)``: the parameters
        a key fills) in the groups to read through one mapping each: first every tensor held whole, in one
        mapping that their views keep open, so it holds the whole tensors' pages only (shared with the other
        ranks' until a fuse writes them); then the split ones in batches of about ``SPLIT_BATCH_BYTES``, copied
        out (``owned``), each batch's mapping closed before the next."""
        split = {key for key in sizes if any(self.splits(name) for name in parameters(key))}
        whole = [key for key in sizes if key not in split]
        return ([whole] if whole else []) + list(batches({k: sizes[k] for k in sizes if k in split},
                                                         SPLIT_BATCH_BYTES))

    def finish(self, where: str) -> nn.Module:
        """The hooks of the split (the all-reduce after each rowwise layer) and the plan's ``adapt``; refuses a
        denoiser whose files left a parameter unread. Records this rank's ``ShardReport``."""
        unread = [name for name, p in self.module.named_parameters() if p.device.type == "meta"]
        if unread:
            raise ModelLoadError(f"{where}: no tensor for {unread[:3]} of the {type(self.module).__name__} "
                                 f"(truncated or a different variant)")
        split_with_hooks(self.module, self.plan, self.load.mesh(), torch.device(self.load.device), self.component,
                         already_split=True)
        report = ShardReport(self.component, sum(1 for s in self.specs.values() if s.dim is not None),
                             self.local_bytes, self.whole_bytes)
        self.load.reports[self.component] = report
        return self.module.eval().requires_grad_(False)


def owned(tensor: torch.Tensor, dtype) -> torch.Tensor:
    """A split tensor (this rank's part) cast to ``dtype`` (None, or a tensor that is not floating point: as it
    is) in storage of its own.

    Why a copy: safetensors hands out views of its file mapping (``get_slice(key)[rows]`` too), and one view kept
    keeps the whole mapping alive, with every page the load touched through it: each rowwise weight is read
    column by column, so all of its rows' pages are faulted in, the other ranks' columns included. Those pages
    stay counted in the rank's memory (measured at Wan2.1-1.3B: 1.05 GiB of the file resident on each tp=2 rank
    after loading, on top of its shards). Owned copies let each batch's mapping go as soon as it is closed; a
    rank then holds its shards' bytes and nothing else of those reads, and a LoRA fused later writes into them
    without copying pages out of the mapping first. A tensor that is no view (``_base``: a column slice made
    contiguous, a cast) is its own already and is not copied again: the freed duplicates stayed in the
    allocator's heap (0.5 GiB on each rank at that width)."""
    target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.to(target, copy=tensor._base is not None)


def load_split_denoiser(folder: Path, component: str, model_index: dict, family, split: SplitLoad, dtype,
                        label: str, family_label: str) -> nn.Module:
    """One denoiser of a diffusers folder, split while it is read (``SplitLoad``): its class from
    ``model_index``, its config and its (possibly sharded) safetensors files from ``folder/component``.
    File errors name the model by ``label``, refusals of the split by ``family_label`` ("wan2.2_moe")."""
    from safetensors import safe_open

    library, class_name = model_index[component]
    where = folder / component
    try:
        cls = component_class(library, class_name)
        config = json_limits.loads((where / "config.json").read_text(encoding="utf-8"))
    except (ImportError, AttributeError, OSError, ValueError) as exc:
        raise ModelLoadError(f"{label}/{component}: cannot build {library}.{class_name}: {exc}") from None
    denoiser = split.start(build_on_meta(cls, config), family, family_label, component)
    keep_fp32 = tuple(getattr(cls, "_keep_in_fp32_modules", None) or ())
    for file in weight_files(where, f"{label}/{component}"):
        name = f"{label}/{component}/{file.name}"
        with safe_open(str(file), framework="pt") as handle:  # an unknown key is ignored, as from_pretrained does
            sizes = {key: stored_bytes(handle.get_slice(key)) for key in handle.keys() if key in denoiser.expected}
        for batch in denoiser.read_groups(sizes):
            with safe_open(str(file), framework="pt") as handle:
                for key in batch:
                    denoiser.take(key, handle.get_slice(key), _load_dtype(key, dtype, keep_fp32), name)
    return denoiser.finish(f"{label}/{component}")


def _load_dtype(key: str, dtype, keep_fp32: tuple) -> Optional[torch.dtype]:
    """What ``from_pretrained(torch_dtype=dtype)`` gives a parameter: float32 in the class's keep-in-fp32
    modules, else ``dtype`` (None: as stored)."""
    if dtype is None:
        return None
    return torch.float32 if any(name in key.split(".") for name in keep_fp32) else dtype


def weight_files(component_dir: Path, label: str) -> list:
    """A diffusers component's safetensors files: the ones its index lists, or its single weights file."""
    from diffusers.utils.constants import SAFE_WEIGHTS_INDEX_NAME, SAFETENSORS_WEIGHTS_NAME

    index = component_dir / SAFE_WEIGHTS_INDEX_NAME
    if index.is_file():
        weight_map = json_limits.load_file(index).get("weight_map", {})
        files = sorted({component_dir / Path(name).name for name in weight_map.values()})
    else:
        files = [component_dir / SAFETENSORS_WEIGHTS_NAME]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{label}: no weights file {missing[0]} (only safetensors is read)")
    return files
