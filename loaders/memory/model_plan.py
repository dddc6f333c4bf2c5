"""``lorabind plan``'s library side: sizes of a model folder or shipped configuration, its plan, as text/JSON."""

from __future__ import annotations

from .planner import GIB, MemoryPlan, plan_memory
from .sizes import ComponentSize, component_sizes


def plan_model(model, *, vram_gib: float, ram_gib: float | None = None, memory: str = "auto",
               dtype: str = "bfloat16") -> tuple[MemoryPlan, list[ComponentSize]]:
    """The memory plan for ``model`` (a diffusers folder or a shipped configuration name) on a device with
    ``vram_gib`` GiB free (and ``ram_gib`` GiB of host memory, unchecked when None). Reads configs only."""
    sizes = component_sizes(model, dtype=dtype)
    host = None if ram_gib is None else int(ram_gib * GIB)
    return plan_memory(sizes, device_free_bytes=int(vram_gib * GIB), host_free_bytes=host, requested=memory), sizes


def plan_to_json(plan: MemoryPlan, sizes: list[ComponentSize]) -> dict:
    """The plan's JSON with the component sizes it was computed from."""
    data = plan.to_json()
    data["components"] = [
        {"name": s.name, "role": s.role, "bytes": s.bytes, "parameters": s.parameters,
         "largest_block_bytes": s.largest_block_bytes} for s in sizes
    ]
    return data


def format_plan(plan: MemoryPlan, sizes: list[ComponentSize]) -> str:
    """A few readable lines: the decision, then where each component lives and how large it is."""
    lines = [f"memory: {plan.memory}  ({'fits' if plan.fits else 'DOES NOT FIT'})", f"reason: {plan.reason}",
             f"peak device: {plan.peak_device_bytes / GIB:.1f} GiB, peak host: {plan.peak_host_bytes / GIB:.1f} GiB"
             f"{', tiled VAE decode' if plan.vae_tiling else ''}{', prefetch' if plan.prefetch else ''}",
             "components:"]
    for s in sizes:
        lines.append(f"  {s.name:<16} {s.role:<18} {s.bytes / GIB:7.2f} GiB  {s.parameters / 1e9:6.2f}B params  "
                     f"-> {plan.placement.get(s.name, '?')}")
    return "\n".join(lines)
