"""Choose a model's memory plan before loading it, and refuse before loading when nothing fits.

Why before: a 14B expert that does not fit takes minutes to load and then fails with an out-of-memory error in
the middle of a run. The sizes come from the configs on the meta device (each source's ``component_sizes``), so
the answer costs no weight reads; the message says what is needed, what is free and which plan would work.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError
from ..families import denoiser_components
from ..io import json_limits
from ..io.regular_files import open_regular
from .devices import device_memory, host_memory
from .planner import MemoryPlan, plan_memory

_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def stored_dtype(folder: Path, model_index: dict) -> str:
    """The floating dtype the denoiser's weights are stored in (what ``dtype=auto`` loads it in); float32 when
    there is nothing to read (a conservative size)."""
    for name in denoiser_components(model_index):
        found = component_stored_dtype(folder / name)
        if found:
            return found
    return "float32"


def stored_dtypes(folder: Path, model_index: dict) -> dict:
    """``{component: dtype name}`` of every component of the folder with readable safetensors weights: what
    ``dtype=auto`` loads each in. Why: diffusers' ``from_pretrained`` without a dtype loads every model in
    float32, so a bf16 Wan folder would take twice its size in memory (and a tensor-parallel load, which reads
    the weights as stored, would disagree with a plain one)."""
    found = {name: component_stored_dtype(folder / name) for name, entry in model_index.items()
             if not name.startswith("_") and isinstance(entry, list)}
    return {name: dtype for name, dtype in found.items() if dtype}


def component_stored_dtype(component_folder: Path):
    """The floating dtype holding most of the bytes of one safetensors header in ``component_folder`` (a bf16
    model may keep a few float32 norms), None when no header there can be read."""
    for file in sorted(component_folder.glob("*.safetensors")):
        try:
            with open_regular(file) as f:
                length = int.from_bytes(f.read(8), "little")
                header = json_limits.loads(f.read(min(length, 16 * 1024 * 1024)))
        except (OSError, ValueError):
            continue
        by_dtype: dict = {}
        for key, entry in header.items() if isinstance(header, dict) else ():
            if key != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") in _SAFETENSORS_DTYPES:
                by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + _span(entry.get("data_offsets"))
        if by_dtype:
            return _SAFETENSORS_DTYPES[max(by_dtype, key=by_dtype.get)]
    return None


def _span(offsets) -> int:
    """Bytes between a header entry's two data offsets; 0 for anything else (a malformed entry weighs nothing)."""
    if isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets):
        return max(offsets[1] - offsets[0], 0)
    return 0


def free_memory(device) -> tuple[int, int | None]:
    """(device free bytes, host free bytes) for planning. On the CPU (and MPS, unified memory) the device IS the
    host, so the host is not counted twice (None)."""
    free, _ = device_memory(device)
    if device.type == "cuda":
        return free, host_memory()[1] or None
    return free, None


def cpu_plan(roles: dict):
    """``auto`` on the CPU: everything stays in RAM. Offloading to the memory it already lives in saves nothing,
    so no sizes are measured (a config the planner cannot read is then the loader's error, as before).
    ``roles``: {component: role} of the weighted components (``FamilyLayout.component_roles``)."""
    names = tuple(roles)
    return MemoryPlan(memory="full", resident=names, placement={n: "device" for n in names},
                      reason="auto on the CPU: every component stays in RAM")


def choose_plan(source, *, device, memory: str, dtype=None):
    """The ``MemoryPlan`` for loading a ``model_sources.ModelSource`` onto ``device`` at ``dtype`` (None: as
    stored); raises ``ModelLoadError`` naming the source when it does not fit."""
    if device.type == "cpu" and memory == "auto":
        return cpu_plan(source.component_roles())
    return plan_for_sizes(source.component_sizes(dtype), label=source.label, device=device, memory=memory)


def plan_for_sizes(sizes, *, label: str, device, memory: str):
    """The ``MemoryPlan`` for components of the given ``ComponentSize``s on ``device`` (any loader's: a folder's
    or single files'); raises ``ModelLoadError`` naming ``label`` when it does not fit."""
    device_free, host_free = free_memory(device)
    plan = plan_memory(sizes, device_free_bytes=device_free, host_free_bytes=host_free, requested=memory)
    if not plan.fits:
        raise ModelLoadError(f"{label} on {device}: {plan.reason}. Nothing was loaded.")
    if device.type == "cpu" and plan.prefetch:  # the CPU's device memory IS the host's: a prefetched expert would
        # be a second expert in RAM (what keeping experts in their files avoids), with no transfer to overlap
        from dataclasses import replace

        plan = replace(plan, prefetch=False)
    return plan
