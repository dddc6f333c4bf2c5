"""A staged module whose host side is the safetensors file its weights came from: no host copy is kept.

Why: a Wan2.2 A14B expert is 26.7 GiB in bf16, and the machines people own (64 GiB, 32 GiB of RAM) cannot hold
both experts and the text encoder at once. Only one expert is in use at a time and the encoder only while
encoding, so the others can stay in their files: an evicted parameter is replaced by a meta tensor of the same
shape (no storage), and bringing the module up reads it from its file again.

Exactness: each file-backed parameter is registered once, before anything can patch it, through
``weight_sources.FileBackedOriginal`` (the file's tensor, cast as at load time, has the live one's digest; then
only its file identity and digest are kept), and every re-read is checked against both, so a file changed
on disk is refused, never used. A fused LoRA is not lost with the evicted weights: the patcher keeps what it fused
as patches (its contributions per parameter) and rewrites them after the re-read (``on_reload``), computing from
the same original in the same way, so the re-fused value is bit-identical. A bind while the module is in its file
only records the patches (the patcher skips meta tensors).

A parameter without a source (an adapter layer, a weight the loader converted) keeps the ordinary host copy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable, Optional

import torch
from torch import nn

from ..io.weight_sources import FileBackedOriginal
from .staging import Staged, module_tensors


def _give_back_freed_memory() -> None:
    """Return freed heap pages to the system (glibc only). Why: tensors below glibc's mmap threshold (which grows
    to 32 MiB as large blocks are freed) live on the heap, and an evicted expert's pages would otherwise stay in
    the process, counted against the machine, until the heap happened to shrink."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl): nothing to do
        pass


def _parameter_slots(module: nn.Module) -> dict:
    """{id(parameter): (parameter, [(owning module, attribute name), ...])}: tied weights share one entry."""
    slots: dict = {}
    for owner in module.modules():
        for attribute, param in owner._parameters.items():
            if param is not None:
                slots.setdefault(id(param), (param, []))[1].append((owner, attribute))
    return slots


class _ExecutionDevice:
    """What diffusers' ``get_module_execution_device`` reads from a module: accelerate's ``_hf_hook`` attribute."""

    def __init__(self, device: torch.device):
        self.execution_device = device


class FileStaged(Staged):
    """``Staged`` with the file-backed parameters kept in their file while off the device (module docstring)."""

    def __init__(self, name: str, module: nn.Module, device: torch.device, sources,
                 on_reload: Optional[Callable[[str], None]] = None):
        """``sources``: ``lookup(component, state_key) -> WeightSource | None`` (the model's weight sources);
        ``on_reload(name)`` is called after the weights were re-read (the patcher rewrites its patches)."""
        self.on_reload = on_reload
        self.records: dict = {}  # state key -> FileBackedOriginal
        self.slots: dict = {}  # state key -> [(owning module, attribute name)]
        for key, (param, owners) in self._named_slots(module).items():
            source = sources.lookup(name, key)
            record = FileBackedOriginal.register(source, param) if source is not None else None
            if record is not None:
                self.records[key], self.slots[key] = record, owners
        super().__init__(name, module, device)
        if self.records:  # diffusers asks accelerate's hook attribute where inputs go (the weights are meta)
            module._hf_hook = _ExecutionDevice(device)
        self._evict()

    @staticmethod
    def _named_slots(module: nn.Module) -> dict:
        names = {id(p): key for key, p in module.named_parameters()}
        return {names[pid]: entry for pid, entry in _parameter_slots(module).items() if pid in names}

    @property
    def file_bytes(self) -> int:
        return sum(record.nbytes for record in self.records.values())

    def held_tensors(self) -> list[torch.Tensor]:
        backed = {id(self._current(key)) for key in self.records}
        return [t for t in module_tensors(self.module) if id(t) not in backed]

    def _current(self, key: str) -> nn.Parameter:
        owner, attribute = self.slots[key][0]
        return owner._parameters[attribute]

    def _place(self, key: str, value: torch.Tensor) -> None:
        old = self._current(key)
        param = nn.Parameter(value, requires_grad=old.requires_grad)
        for owner, attribute in self.slots[key]:
            owner._parameters[attribute] = param

    def _evict(self) -> None:
        for key in self.records:
            old = self._current(key)
            self._place(key, torch.empty(old.shape, dtype=old.dtype, device="meta"))

    def upload(self, stream=None) -> None:
        """Re-read the file-backed weights (verified) onto the device, then the rest as ``Staged`` does."""
        if self.on_device:
            return
        for key, record in self.records.items():
            value = record.read(f"{self.name}:{key}")
            self._place(key, value if self.device.type == "cpu" else value.to(self.device))
        super().upload(stream)
        if self.on_reload is not None:
            self.on_reload(self.name)

    def drop(self) -> None:
        """Back to the file: the device copies are released, nothing is copied to the host."""
        if not self.on_device:
            return
        super().drop()
        self._evict()
        _give_back_freed_memory()

    def detach(self) -> None:
        """Leave the plan (the model is dropped or re-placed): the weights come back into host RAM, patched."""
        self.drop()
        for key, record in self.records.items():
            self._place(key, record.read(f"{self.name}:{key}"))
        self.records = {}
        self.module.__dict__.pop("_hf_hook", None)
        if self.on_reload is not None:
            self.on_reload(self.name)

