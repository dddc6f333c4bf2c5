"""A request's own LoRAs on its own rows of a batched forward: ``y[rows] += Σ a·s·(x[rows] @ downᵀ) @ upᵀ``
(``a``: the spec's strength or scale, ``s``: the pair's own scale).

Why our own per-row product and not peft's mixed-batch forward (``adapter_names``): peft gives each row one
adapter at that adapter's one scale, while a request here may stack several LoRAs, each at its own strength, and
two requests may use one file at two strengths. Grouping rows by request and adding each request's low-rank
products to its rows is what Punica's segmented kernels do for LLM serving; here it is one small product per
(linear, request, LoRA), in float32 and added once in the output's dtype, as peft's unfused adapters compute.

The products run in a transient hook (``forward_hooks.ROW_LORA``) on each targeted linear, attached for one
batched forward and detached after it, above whatever else wraps the layer (fp8 compute, GGUF patches, a peft
layer). A layer that sees the batch anywhere but in its first dimension is refused (``RowLoraError``): the engine
then runs that batch's requests one by one, fused.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..errors import LoraBindError
from ..forward_hooks import ROW_LORA, attach, detach

FACTOR_CACHE_BYTES = 512 * 2**20  # float32 copies of the factors of bf16 LoRAs, most recently used kept


class RowLoraError(LoraBindError):
    """A layer's input does not carry the batch first, so its rows cannot be told apart."""


@dataclass(frozen=True)
class RowTerms:
    """Rows ``start:stop`` of a batch get ``amount`` times each delta (``LowRankDelta``, its scale included)."""

    start: int
    stop: int
    terms: tuple  # ((LowRankDelta, amount), ...)


class RowLora:
    """Hooks the layers a batch's own LoRAs target for one forward; keeps their factors in float32."""

    def __init__(self, cache_bytes: int = FACTOR_CACHE_BYTES):
        self._factors: OrderedDict = OrderedDict()  # id(delta) -> (delta, device, down32, up32, bytes copied)
        self._cache_bytes, self._held = cache_bytes, 0

    @contextlib.contextmanager
    def applied(self, component, rows_by_path: dict, total_rows: int):
        """For the body: each module ``path`` of ``component`` adds its ``RowTerms`` to its output."""
        hooked = []
        try:
            for path, rows in rows_by_path.items():
                module = component.get_submodule(path)
                attach(module, ROW_LORA, (path, tuple(rows), total_rows), output=self._add_rows, transient=True)
                hooked.append(module)
            yield
        finally:
            for module in hooked:
                detach(module, ROW_LORA)

    def _add_rows(self, module, state, args, output):
        path, rows, total = state
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.shape[0] != total or output.shape[0] != total:
            raise RowLoraError(f"layer {path} does not see the batch of {total} first (input "
                               f"{tuple(getattr(x, 'shape', ()))}), so a request's own LoRA cannot be applied "
                               "to its rows alone")
        for part in rows:
            xs = x[part.start:part.stop].float()
            added = None
            for delta, amount in part.terms:
                down, up = self._float32(delta, x.device)
                term = (xs @ down.t()) @ up.t() * (float(amount) * float(delta.scale))
                added = term if added is None else added + term
            output[part.start:part.stop] += added.to(output.dtype)
        return output

    def _float32(self, delta, device) -> tuple:
        held = self._factors.pop(id(delta), None)
        if held is not None:
            if held[0] is delta and held[1] == device:
                self._factors[id(delta)] = held
                return held[2], held[3]
            self._held -= held[4]
        down = delta.down.to(device=device, dtype=torch.float32)
        up = delta.up.to(device=device, dtype=torch.float32)
        copied = 0 if (down is delta.down and up is delta.up) else _bytes(down, up)  # float32 factors: no copy
        self._factors[id(delta)] = (delta, device, down, up, copied)
        self._held += copied
        while self._held > self._cache_bytes and len(self._factors) > 1:
            self._held -= self._factors.popitem(last=False)[1][4]
        return down, up


def _bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
