"""Memory planning: how much device/host memory each component needs and where it should live.

``sizes`` measures components from their configs on the meta device (no weights read); ``planner`` turns those
sizes and the free memory into a ``MemoryPlan`` that the runtime applies (devices, offload hooks, expert swap).
"""

from .planner import MEMORY_PLANS, PLACEMENTS, MemoryPlan, default_decode_bytes, plan_memory
from .sizes import ComponentSize, component_sizes

__all__ = [
    "MEMORY_PLANS", "PLACEMENTS", "ComponentSize", "MemoryPlan", "component_sizes", "default_decode_bytes",
    "plan_memory",
]
