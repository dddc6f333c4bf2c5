"""Loaded diffusers models, shared by every handle that names them.

``LoadedModel`` is the one mutable object behind ``ModelHandle``s: the sampler binds it (via
``loaders.binding``) to the state a handle describes. ``binding_state`` belongs to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class LoadedModel:
    path: str  # resolved diffusers folder
    name: str  # name relative to the models root, for messages
    family: str  # "wan2.1", "wan2.2_moe", "qwen_image", "minimax_h3"
    pipeline: Any  # the diffusers pipeline object (components shared with ``components``)
    components: dict = field(default_factory=dict)  # denoiser name -> torch.nn.Module
    model_index: dict = field(default_factory=dict)
    binding_state: Any = None  # owned by loaders.binding (patcher backups, active adapters)
