"""Staging: a module whose weights live on the host and come to the device on demand (``apply_plan``'s ``swap``
and ``on_demand`` placements; ``file_staging`` keeps the host side in the weights' files instead).

On the CPU a staged "device" copy is placed at the same offset modulo 64 bytes as its source: the CPU matmul
kernels round differently for the same values at a different alignment, and every plan must compute exactly
what ``full`` computes (see ``apply_plan``'s docstring).
"""

from __future__ import annotations

import torch
from torch import nn

CPU = torch.device("cpu")
_ALIGNMENT = 64  # bytes; the CPU kernels' rounding depends on a tensor's address modulo this


def module_tensors(module: nn.Module) -> list[torch.Tensor]:
    return list(module.parameters()) + [b for b in module.buffers() if b is not None]


def same_alignment_copy(source: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``source`` starting at the same address modulo 64 bytes (see the module docstring)."""
    size = source.element_size()
    pad = _ALIGNMENT // size
    flat = torch.empty(source.numel() + pad, dtype=source.dtype)
    shift = ((source.data_ptr() - flat.data_ptr()) % _ALIGNMENT) // size
    copy = flat[shift:shift + source.numel()].view(source.shape)
    copy.copy_(source)
    return copy


class Staged:
    """One module whose weights live on the host and come to the device on demand (see the module docstring)."""

    def __init__(self, name: str, module: nn.Module, device: torch.device):
        self.name = name
        self.module = module
        self.device = device
        self.pin = device.type == "cuda"
        self.host: dict = {}  # tensor (param or buffer object) -> its host copy
        self.on_device = False
        self.pending = None  # CUDA event of an upload still running on the side stream
        self.refresh()

    def _host_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        copy = tensor.data if tensor.device.type == "cpu" else tensor.data.to(CPU)
        if self.pin and not copy.is_pinned():
            try:
                copy = copy.pin_memory()
            except RuntimeError:  # no page-locked memory left: a pageable copy still works, only slower
                pass
        return copy

    def held_tensors(self) -> list[torch.Tensor]:
        """The tensors this stager keeps a host copy of (all of them here; a file-backed stager keeps fewer)."""
        return module_tensors(self.module)

    def refresh(self) -> None:
        """Pick up tensors added or removed since (peft adapter layers), keeping every one where the module is."""
        current = self.held_tensors()
        known = set(current)
        for tensor in [t for t in self.host if t not in known]:
            del self.host[tensor]
        for tensor in current:
            if tensor not in self.host:
                self.host[tensor] = self._host_copy(tensor)
                if self.on_device:
                    tensor.data = self._device_copy(self.host[tensor])
                else:
                    tensor.data = self.host[tensor]
        if not self.on_device:
            for tensor, copy in self.host.items():
                tensor.data = copy

    def _device_copy(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":  # a separate "device" copy, so the CPU runs the same code path as a GPU
            return same_alignment_copy(host)
        return host.to(self.device, non_blocking=host.is_pinned())

    def copy_out_of_files(self, mapped) -> None:
        """Replace each host copy that is still pages of a file (``mapped``: ``file_pages.FileMappings``) by an
        anonymous copy at the same alignment: the host copy is kept for the model's life (``file_pages``)."""
        for tensor, host in list(self.host.items()):
            if host.device.type == "cpu" and host.numel() and mapped.holds(host.data_ptr()):
                self.host[tensor] = same_alignment_copy(host)
                if not self.on_device:
                    tensor.data = self.host[tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host.values())

    def upload(self, stream=None) -> None:
        """Bring the weights to the device; on a CUDA side stream the copy overlaps compute until ``wait``."""
        if self.on_device:
            return
        if stream is not None:
            with torch.cuda.stream(stream):
                for tensor, host in self.host.items():
                    tensor.data = self._device_copy(host)
                self.pending = torch.cuda.Event()
                self.pending.record(stream)
        else:
            for tensor, host in self.host.items():
                tensor.data = self._device_copy(host)
        self.on_device = True

    def wait(self) -> None:
        """Make the current stream wait for a side-stream upload before the weights are read."""
        if self.pending is not None:
            torch.cuda.current_stream(self.device).wait_event(self.pending)
            for tensor in self.host:  # the side stream allocated them; the compute stream now uses them
                tensor.data.record_stream(torch.cuda.current_stream(self.device))
            self.pending = None

    def drop(self) -> None:
        """Take the weights off the device: the host copy is current, so this is no copy at all."""
        if not self.on_device:
            return
        self.wait()
        for tensor, host in self.host.items():
            tensor.data = host
        self.on_device = False

    def write_back(self, tensors) -> int:
        """Copy tensors a bind wrote on the device into the host copy (the source of truth)."""
        if not self.on_device:
            return 0
        count = 0
        for tensor in tensors:
            host = self.host.get(tensor)
            if host is not None and tensor.data.data_ptr() != host.data_ptr():
                host.copy_(tensor.data)
                count += 1
        return count
