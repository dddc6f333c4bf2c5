"""Immutable handles passed along graph edges.

Why: a graph may use one loaded model in several branches with different LoRAs. Nodes therefore never
mutate a model; they return new handles that *describe* the wanted state (patch set to fuse, dynamic adapters
with scales, schedule contracts). The sampler makes the shared model match a handle right before denoising
("binding"). Handles are cheap (no tensors copied) and compare by identity (``eq=False``): the executor's cache
must never hash them by value. The socket types that carry them along a graph's edges are the nodes' vocabulary
(``usecases.vocabulary``), not the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .contract_types import ScheduleContract


@dataclass(frozen=True)
class FuseSpec:
    """One LoRA file to fuse into one component at one strength (LightX2V ``lora_configs`` semantics)."""

    path: str  # absolute, resolved path of the .safetensors file or PEFT folder
    strength: float
    component: str  # the denoiser component it goes into (the model's family names them)
    name: str = ""  # display name (relative name under the loras root) for messages
    lenient: bool = False  # keys that match nothing in the model are skipped (listed) instead of refused
    # multipliers of ``strength`` per step of the run (binding.strength_schedules.StrengthSchedule); None: constant
    strength_schedule: Any = None


@dataclass(frozen=True)
class AdapterSpec:
    """One dynamic (unfused, peft-injected) adapter activated at a scale for a run. Scale 0 means off."""

    path: str
    scale: float
    component: str = ""  # the denoiser it attaches to; "" = the model's main denoiser
    name: str = ""
    lenient: bool = False  # as FuseSpec.lenient
    strength_schedule: Any = None  # as FuseSpec.strength_schedule, multiplying ``scale``


@dataclass(frozen=True, eq=False)
class ModelHandle:
    """A loaded model plus the state a sampler must bind before denoising.

    ``model`` is the shared ``loaders.models.store.LoadedModel`` (loaded once per path). ``fuses`` is the exact
    patch set to fuse; ``adapters`` the dynamic adapters attached by model-level nodes (MiniMax-H3);
    ``contracts`` the schedule contracts attached by fuses or pinned by the checkpoint.
    """

    model: Any
    fuses: tuple[FuseSpec, ...] = ()
    adapters: tuple[AdapterSpec, ...] = ()
    contracts: tuple[ScheduleContract, ...] = ()

    @property
    def family(self) -> str:
        return self.model.family

    def __repr__(self) -> str:  # short: error payloads (execution_error.current_inputs) show it to users
        fuses = ", ".join(f"{f.name or f.path}@{f.strength:g}{_scheduled(f)}->{f.component}" for f in self.fuses)
        adapters = ", ".join(f"{a.name or a.path}@{a.scale:g}{_scheduled(a)}" for a in self.adapters)
        return f"ModelHandle({self.model.name!r}, {self.family}, fuses=[{fuses}], adapters=[{adapters}])"

    def with_fuses(self, *fuses: FuseSpec, contracts: tuple[ScheduleContract, ...] = ()) -> "ModelHandle":
        return replace(self, fuses=self.fuses + tuple(fuses), contracts=self.contracts + tuple(contracts))

    def with_adapters(self, *adapters: AdapterSpec, contracts: tuple[ScheduleContract, ...] = ()) -> "ModelHandle":
        return replace(self, adapters=self.adapters + tuple(adapters), contracts=self.contracts + tuple(contracts))


@dataclass(frozen=True, eq=False)
class AdapterHandle:
    """Dynamic adapters (stacked by chaining ``LoadPEFTAdapter`` nodes) and the contracts they declare."""

    adapters: tuple[AdapterSpec, ...] = ()
    contracts: tuple[ScheduleContract, ...] = ()

    def stacked(self, adapter: AdapterSpec, contracts: tuple[ScheduleContract, ...] = ()) -> "AdapterHandle":
        return AdapterHandle(self.adapters + (adapter,), self.contracts + tuple(contracts))

    def __repr__(self) -> str:
        return "AdapterHandle([" + ", ".join(f"{a.name or a.path}@{a.scale:g}{_scheduled(a)}"
                                             for a in self.adapters) + "])"


@dataclass(frozen=True, eq=False)
class ScheduleHandle:
    """A SCHEDULE edge: one contract (from ``MiniMaxTurboSchedule`` or a sigma node)."""

    contract: ScheduleContract

    def __repr__(self) -> str:
        return f"ScheduleHandle({self.contract.describe()})"


@dataclass(frozen=True, eq=False)
class ConditioningHandle:
    """Encoded prompt for one model family (text-encoder output of that model)."""

    embeds: Any  # torch.Tensor [B, seq, dim]
    family: str
    text: str = ""
    mask: Any = None
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"ConditioningHandle({self.family}, {self.text!r}, shape={_shape(self.embeds)})"


@dataclass(frozen=True, eq=False)
class LatentHandle:
    """Latents for one family. ``samples`` is the main (video/image) latent; ``extra`` may hold e.g. audio."""

    samples: Any  # torch.Tensor
    family: str
    kind: str = "video"  # "video", "image", "video+audio"
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"LatentHandle({self.family}, {self.kind}, shape={_shape(self.samples)})"


def _scheduled(spec) -> str:
    return "" if spec.strength_schedule is None else f"×[{spec.strength_schedule.describe()[:60]}]"


def _shape(tensor) -> list:
    return list(getattr(tensor, "shape", ()))
