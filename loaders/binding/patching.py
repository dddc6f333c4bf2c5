"""Exact, transactional, incremental weight patching ("fusing") of LoRA patch sets.

Why our own patcher instead of diffusers' ``fuse_lora``/``unfuse_lora``: peft unfuses by subtraction
(``W -= delta``), which drifts (1 bf16 ulp per fuse/unfuse cycle, see the team's feasibility notes), silently
drops full diffs (``diff``, ``diff_m``, norm diffs) and re-rounds once per stacked LoRA. Here:

* every patched parameter keeps its exact original, so restoring is bit-exact in any dtype. A weight that came
  unmodified from a safetensors file (``weight_sources``: proven by a digest, the file's side cached per file
  version) is re-read from that file when it must be rewritten, checked against that digest, instead of being
  copied: the extra host memory of a bind is then about one layer, not the size of the touched weights. Any
  other weight keeps a copy (on CPU by default), but a GGUF-quantized one is never rewritten at all: it gets its
  patches when it dequantises (``dequant_patches``);
* a parameter's patched value is the ORIGINAL plus every contribution (``strength ·`` each kind's delta,
  ``lora.kinds``), summed in float32 and rounded once (``fused_rows``), so stacking LoRAs never re-rounds in
  between and the result does not depend on the order in which they were applied;
* a patch set is a value: applying a new one only rewrites the parameters whose set of contributions changed
  (changing one LoRA's strength rewrites only that LoRA's parameters);
* an apply is a transaction: if anything raises part-way (a bad tensor, an interrupt raised by the
  ``check_interrupt`` callback between layers, a KeyboardInterrupt), every parameter written in this call is
  brought back to its pre-call state before the error propagates;
* work is done layer by layer (one module's parameters at a time), each parameter in row chunks of about
  ``CHUNK_BYTES``, so the extra memory is the RAM backups plus one layer and one small float32 buffer, never a
  second copy of the model (nor a float32 copy of its largest layer).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

import torch
from torch import nn

from .. import fp8, gguf_weights
from ..errors import KeyMatchError
from ..io.safetensors_reads import ReadBuffer
from ..io.weight_sources import FileBackedOriginal
from ..lora.canonical import TargetPatch
from ..lora.kinds import WeightDelta
from . import dequant_patches
from .fused_rows import NonFiniteResultError, Workspace, write_patched
from .sharded_deltas import check_shardable, local_part
from .writable_pages import prefault_for_write


@dataclass(frozen=True)
class PatchLayer:
    """One LoRA fused into one component at one strength.

    ``key`` identifies the LoRA's *content* (e.g. resolved path plus file size and mtime): two layers with the
    same key and strength contribute the same delta, which is what makes incremental re-application possible.
    """

    key: str
    component: str
    strength: float
    targets: Mapping[str, TargetPatch]  # diffusers module path -> TargetPatch
    name: str = ""  # for messages

    @property
    def label(self) -> str:
        return self.name or self.key


@dataclass(frozen=True, eq=False)  # never compared by value: that would compare tensors
class _Contribution:
    """What one PatchLayer adds to one parameter: adapter kinds' deltas (``TargetPatch.parameter_deltas``: a
    weight delta and/or a full diff), each computing its own rows."""

    key: str
    strength: float
    deltas: tuple  # of WeightDelta

    @property
    def signature(self) -> tuple:
        return (self.key, self.strength)


@dataclass
class PatchStats:
    """Cumulative counters, so callers and tests can see how much work the engine really did."""

    apply_calls: int = 0
    tensors_written: int = 0  # parameters written with a patched value
    tensors_restored: int = 0  # parameters copied back from their original


@dataclass
class ApplyResult:
    written: int = 0  # parameters (re)patched in this call
    restored: int = 0  # parameters returned to their original in this call
    unchanged: int = 0  # parameters patched before and after with the same contributions (not touched)


def param_id(component: str, module_path: str, param_name: str) -> str:
    """The "component:module.param" id used in ``last_written`` and error messages."""
    return f"{component}:{module_path}.{param_name}" if module_path else f"{component}:{param_name}"


def base_module(module: nn.Module) -> nn.Module:
    """The module holding the real parameters: peft wraps targeted layers and keeps the original as base_layer."""
    get_base = getattr(module, "get_base_layer", None)
    return get_base() if callable(get_base) else module


class WeightPatcher:
    """Brings ``{component name: nn.Module}`` to "originals + a patch set", exactly and incrementally."""

    def __init__(self, components: Mapping[str, nn.Module], *, backup_device: str | torch.device = "cpu",
                 weight_sources=None):
        """``weight_sources``: an object with ``lookup(component, state_key) -> WeightSource | None`` (e.g.
        ``FolderWeightSources``); without it every original is a RAM copy."""
        self.components = components
        self.backup_device = torch.device(backup_device)
        self.weight_sources = weight_sources
        self._originals: dict[str, torch.Tensor] = {}  # param id -> exact copy of the unpatched tensor
        self._file_backed: dict[str, FileBackedOriginal] = {}  # param id -> re-readable original
        self._applied: dict[str, tuple[_Contribution, ...]] = {}  # param id -> contributions now in the tensor
        self._locations: dict[str, tuple[str, str, str]] = {}  # param id -> (component, module path, param)
        self.last_written: set[str] = set()
        self.stats = PatchStats()
        self._workspace = Workspace()
        # (apply's thread, the buffer its file-backed originals are re-read into): one apply long, that thread only
        self._read_buffer: Optional[tuple[int, ReadBuffer]] = None

    # ------------------------------------------------------------------ queries

    @property
    def patched(self) -> set[str]:
        """Parameter ids currently holding a patched value."""
        return set(self._applied)

    def patched_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """(id, tensor) of each patched parameter holding its patch (not GGUF's, patched as they dequantise)."""
        held = [p for p in sorted(self._applied) if not dequant_patches.is_deferred(*self._module_and_name(p))]
        return [(pid, self._tensor(pid)) for pid in held]

    def last_written_tensors(self) -> dict[str, list[torch.Tensor]]:
        """{component: the tensors the last ``apply`` wrote or restored} (a memory plan syncs its copies of them)."""
        written: dict[str, list[torch.Tensor]] = {}
        for pid in sorted(self.last_written):
            if not dequant_patches.is_deferred(*self._module_and_name(pid)):  # GGUF bytes are never written
                written.setdefault(self._locations[pid][0], []).append(self._tensor(pid))
        return written

    def restore_sources(self) -> dict:
        """Per component, how the originals of its patched parameters are kept: ``file`` (re-read from the
        safetensors file it was loaded from) or ``ram`` (a copy), with counts and bytes."""
        report: dict[str, dict] = {}
        for pids, kind in ((self._file_backed, "file"), (self._originals, "ram")):
            for pid, held in pids.items():
                entry = report.setdefault(self._locations[pid][0], {"file": 0, "file_bytes": 0, "ram": 0,
                                                                    "ram_bytes": 0})
                entry[kind] += 1
                entry[f"{kind}_bytes"] += held.nbytes if kind == "file" else held.numel() * held.element_size()
        return report

    # ------------------------------------------------------------------ planning (no writes)

    def plan(self, layers: Sequence[PatchLayer]) -> dict[str, tuple[_Contribution, ...]]:
        """Validate every target of every layer against the modules and return the wanted contributions.

        Nothing is written, so a bad LoRA (unknown module, missing parameter, wrong shape) is refused before
        any weight changes.
        """
        wanted: dict[str, list[_Contribution]] = {}
        for layer in layers:
            if layer.component not in self.components:
                raise KeyMatchError(
                    f"LoRA '{layer.label}' targets component '{layer.component}', which this model does not have "
                    f"(components: {', '.join(sorted(self.components)) or 'none'})."
                )
            if layer.strength == 0:
                continue  # strength 0 contributes nothing: those parameters stay (or become) original
            root = self.components[layer.component]
            for module_path, target in layer.targets.items():
                module = self._module(root, layer, module_path)
                for name, deltas in target.parameter_deltas().items():
                    for delta in deltas:
                        self._check_delta_layout(layer, module, module_path, name, delta)
                    pid = param_id(layer.component, module_path, name)
                    self._locations[pid] = (layer.component, module_path, name)
                    wanted.setdefault(pid, []).append(_Contribution(layer.key, float(layer.strength), deltas))
        # canonical order: the float32 sum (and so the result's bits) does not depend on the order of the layers
        return {pid: tuple(sorted(c, key=lambda x: x.signature)) for pid, c in wanted.items()}

    # ------------------------------------------------------------------ applying

    def apply(
        self,
        layers: Sequence[PatchLayer],
        *,
        check_interrupt: Optional[Callable[[], None]] = None,
        on_progress: Optional[Callable[[int, int], None]] = None,
    ) -> ApplyResult:
        """Make the components hold exactly originals + ``layers``; touch only parameters that must change.

        ``check_interrupt`` and ``on_progress(done, total)`` are called between layers; whatever they raise
        aborts the call, and every parameter written so far is brought back to its pre-call value first.
        """
        wanted = self.plan(layers)
        changed = [
            pid
            for pid in sorted(set(wanted) | set(self._applied), key=self._locations.__getitem__)
            if _signature(wanted.get(pid, ())) != _signature(self._applied.get(pid, ()))
        ]
        result = ApplyResult(unchanged=len((set(wanted) & set(self._applied)) - set(changed)))
        self.stats.apply_calls += 1
        self.last_written = set()
        before = dict(self._applied)
        touched: list[str] = []
        groups = _group_by_module(changed, self._locations)
        for pid in changed:  # a file-backed original whose file changed is refused before anything is written
            if pid in self._file_backed:
                self._file_backed[pid].check_identity(pid)
        self._read_buffer = (threading.get_ident(), ReadBuffer())
        try:
            for index, group in enumerate(groups):
                if check_interrupt is not None:
                    check_interrupt()
                with torch.no_grad():
                    for pid in group:
                        touched.append(pid)
                        self._write(pid, wanted.get(pid, ()))
                if on_progress is not None:
                    on_progress(index + 1, len(groups))
        except BaseException:
            self._roll_back(touched, before)
            raise
        finally:
            self._read_buffer = None
        result.written = sum(pid in self._applied for pid in touched)
        result.restored = len(touched) - result.written
        self.stats.tensors_written += result.written
        self.stats.tensors_restored += result.restored
        self.last_written = set(touched)
        self._drop_unused_originals()
        return result

    def restore_all(self, *, check_interrupt: Optional[Callable[[], None]] = None) -> ApplyResult:
        """Bring every patched parameter back to its original (bit-exact)."""
        return self.apply((), check_interrupt=check_interrupt)

    # ------------------------------------------------------------------ internals

    def _module(self, root: nn.Module, layer: PatchLayer, module_path: str) -> nn.Module:
        try:
            module = root.get_submodule(module_path) if module_path else root
        except AttributeError:
            raise KeyMatchError(
                f"LoRA '{layer.label}': module '{module_path}' does not exist in component '{layer.component}'."
            ) from None
        return base_module(module)

    def _check_delta_layout(self, layer: PatchLayer, module: nn.Module, module_path: str, name: str,
                            delta: WeightDelta) -> None:
        """The kind's delta must lay out like ``<module>.<name>`` (asked of the kind: ``delta_shape``), whose shape
        is the weight's logical one (a GGUF layer's ``quant_shape``, not its bytes')."""
        param = _param_or_none(module, name)
        where = f"{module_path}.{name}" if module_path else name
        if param is None:
            raise KeyMatchError(f"LoRA '{layer.label}': component '{layer.component}' has no parameter '{where}'.")
        shape = gguf_weights.logical_shape(param)
        got = delta.delta_shape(shape)
        if got is None:
            shapes = ", ".join(str(list(t.shape)) for t in delta.tensors())
            raise KeyMatchError(
                f"LoRA '{layer.label}': '{module_path}' has {delta.kind} factors {shapes}, which do not form a "
                f"delta of the model's {name} shape {list(shape)}.")
        if shape != tuple(got):
            raise KeyMatchError(f"LoRA '{layer.label}': shape mismatch on '{layer.component}:{where}': the model "
                                f"has {list(shape)}, the LoRA delta is {list(got)}.")
        check_shardable(param, delta, f"LoRA '{layer.label}'", f"{layer.component}:{where}")  # DTensor: whole shape

    def _module_and_name(self, pid: str) -> tuple:
        component, module_path, name = self._locations[pid]
        root = self.components[component]
        return base_module(root.get_submodule(module_path) if module_path else root), name

    def _tensor(self, pid: str) -> torch.Tensor:
        return _param_or_none(*self._module_and_name(pid))

    def _original(self, pid: str, tensor: torch.Tensor, shard=None) -> torch.Tensor:
        """The exact unpatched value of ``pid``: its RAM backup, a verified re-read of its file, or — on first
        touch, while ``tensor`` still holds it — registered as one of the two. A tensor-parallel ``shard`` is
        re-read as its rows or columns of the stored tensor: a rank keeps no RAM copy of its shards either."""
        original = self._originals.get(pid)
        if original is not None:
            return original
        record = self._file_backed.get(pid)
        if record is not None:
            owner, buffer = self._read_buffer or (None, None)  # used at once: the buffer's next read overwrites it
            return record.read(pid, buffer if owner == threading.get_ident() else None)
        component, module_path, name = self._locations[pid]
        key = f"{module_path}.{name}" if module_path else name
        source = self.weight_sources.lookup(component, key) if self.weight_sources is not None else None
        if source is not None and shard is not None:
            source = source.shard(shard.dim, shard.start, shard.stop)
        record = FileBackedOriginal.register(source, tensor) if source is not None else None
        if record is not None:
            # the live tensor still IS the original here; ``write_patched`` reads each row chunk of its source
            # before writing those rows, so it may read and write the same tensor (no layer-size copy)
            self._file_backed[pid] = record
            return tensor
        original = tensor.detach().to(self.backup_device, copy=True)
        self._originals[pid] = original
        return original

    def rewrite(self, component: str) -> None:
        """Write ``component``'s patches again after its weights were re-read from their files (a memory plan
        keeps it there while it is not in use, ``placement.file_staging``): same originals, same bits."""
        with torch.no_grad():
            for pid in [p for p in self._applied if self._locations[p][0] == component]:
                self._write(pid, self._applied[pid])

    def _write(self, pid: str, contributions: tuple[_Contribution, ...]) -> None:
        module, name = self._module_and_name(pid)
        try:
            self._write_value(pid, module, name, contributions)
        except NonFiniteResultError as exc:
            raise NonFiniteResultError(f"{pid}: {exc} (LoRA {', '.join(c.key for c in contributions)})") from None
        if contributions:
            self._applied[pid] = contributions
        else:
            self._applied.pop(pid, None)

    def _write_value(self, pid: str, module: nn.Module, name: str, contributions: tuple) -> None:
        """By how the weight is stored: a GGUF layer gets its patch list (applied when it dequantises; it keeps no
        original); one whose data is in its file (meta) is patched on the re-read (``rewrite``); any other is
        rewritten in place from its original (fp8: rounded into its storage, ``fp8.StoredWeight``)."""
        if dequant_patches.is_deferred(module, name):
            dequant_patches.set_patches(module, name, contributions)
            return
        tensor = _param_or_none(module, name)
        if tensor.is_meta:
            return
        local, shard = local_part(tensor)  # tensor parallel: this rank writes what it holds (sharded_deltas)
        contributions = shard.contributions(contributions, pid) if shard is not None else contributions
        first_touch = pid not in self._originals and pid not in self._file_backed
        if first_touch:
            prefault_for_write(local)  # a weight still mapped from its file: one call, not a fault per page
        original = self._original(pid, local, shard)
        if not contributions:
            local.copy_(original)
            return
        write_patched(local, original, contributions, self._workspace, storage=fp8.stored_weight(module, name),
                      seed_key=pid, dest_holds_original=first_touch)

    def _roll_back(self, touched: Iterable[str], before: dict) -> None:
        """Recompute each touched parameter's pre-call value (deterministic, so bit-identical) or copy it back."""
        with torch.no_grad():
            for pid in touched:
                self._write(pid, before.get(pid, ()))
        self._applied = before
        self._drop_unused_originals()

    def _drop_unused_originals(self) -> None:
        for held in (self._originals, self._file_backed):
            for pid in [p for p in held if p not in self._applied]:
                del held[pid]


def plan_state_keys(component: str, module: nn.Module, layers: Sequence[PatchLayer]) -> dict[str, tuple]:
    """``{state-dict key: contributions}`` of ``layers`` on one component, validated like ``apply``; writes nothing.

    For tools that stream a model's weight files instead of patching a loaded module (``lorabind merge``): the
    module may live on the ``meta`` device, only its structure and shapes are used. Each value is turned into
    the fused tensor with ``write_patched(new tensor, stored tensor, contributions)``.
    """
    wanted = WeightPatcher({component: module}).plan(layers)
    return {pid.split(":", 1)[1]: contributions for pid, contributions in wanted.items()}  # see ``param_id``


def _signature(contributions: tuple[_Contribution, ...]) -> tuple:
    return tuple(c.signature for c in contributions)


def _param_or_none(module: nn.Module, name: str) -> Optional[torch.Tensor]:
    tensor = module._parameters.get(name)
    if tensor is None:
        tensor = module._buffers.get(name)
    return tensor


def _group_by_module(pids: Sequence[str], locations: Mapping[str, tuple[str, str, str]]) -> list[list[str]]:
    """Consecutive parameter ids of the same module form one "layer" (the unit between interrupt checks)."""
    return [list(group) for _, group in itertools.groupby(pids, key=lambda pid: locations[pid][:2])]


def patched_value(original: torch.Tensor, deltas: Sequence[WeightDelta], strength: float, dtype=torch.float32):
    """``original + strength · Σ deltas`` as a new ``dtype`` tensor computed like a fuse (same kinds, row chunks,
    one rounding), for a host whose own patcher writes it (ComfyUI's ModelPatcher): in the host weight's dtype it is
    our fuse's value bit for bit. ``original`` is the unpatched weight a DoRA delta is computed from."""
    value = torch.empty(original.shape, dtype=dtype, device=original.device)
    write_patched(value, original, [_Contribution("", float(strength), tuple(deltas))])
    return value
