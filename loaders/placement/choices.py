"""``lorabind plan``'s answer to "what do I download for my machine": every way the weights can be stored (bf16,
fp8, each GGUF type) under every memory plan, what fits ranked by expected speed, and the files to get.

Why a ranking and not one plan: the plan for the weights a user names answered "does not fit" on the 12 GiB and
8 GiB GPUs most people have, while a smaller storage of the same model fits them; and "the nearest that fits" was
computed for a machine without limits, so it named plans that did not fit the stated one. Here every fitting
choice fits the stated machine by the planner's own figures, and when none does the smallest machine that would
is searched for and checked against the planner before it is named.

Expected speed (``Choice.run_seconds``): the seconds a reference run of ``REFERENCE_STEPS`` steps spends on what
differs between choices, beyond the computing they all do alike. Rough constants, stated once:

* moving weights to the device, at ``BUS_BYTES_PER_S`` (PCIe 4.0 x16 moves a 28.6 GB expert in about 0.9 s): ``full``
  nothing; ``swap_experts`` each expert once per run (the switch is hidden when the next expert is prefetched);
  ``offload_model`` every denoiser once per run; ``offload_blocks`` the blocks of the denoiser in use at every
  step. An encoder that is not kept on the device comes over once per run. On the CPU nothing moves; a component
  staged from its file is re-read at ``DISK_BYTES_PER_S``.
* turning stored weights into the compute dtype at every step, for the denoiser in use: fp8 upcast at
  ``UPCAST_BYTES_PER_S`` of output, GGUF dequantized at ``DEQUANT_BYTES_PER_S`` (k-quants at
  ``DEQUANT_K_BYTES_PER_S``); bf16 costs nothing.

Ties go to the storage closer to the original (``WEIGHTS`` order). Quality is not ranked: q4 files lose detail
that bf16 and fp8 keep; the text says which storage each choice uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import ModelLoadError
from .planner import GIB, MEMORY_PLANS, MemoryPlan, describe_plan, plan_candidates, shortfall
from .published import GGUF_FILE_TYPES, QUANT, published_files
from .sizes import DENOISER_ROLES, GGUF_WEIGHTS, WEIGHTS, component_sizes, stored_as

REFERENCE_STEPS = 20
BUS_BYTES_PER_S = 32e9
DISK_BYTES_PER_S = 2e9
UPCAST_BYTES_PER_S = 500e9
DEQUANT_BYTES_PER_S = 150e9
DEQUANT_K_BYTES_PER_S = 100e9
CPU_PLANS = ("full", "swap_experts", "offload_model")  # streaming blocks to the memory they live in saves nothing
MAX_SEARCH_GIB = 1024  # the smallest machine is searched up to this much device or host memory


@dataclass(frozen=True)
class Choice:
    weights: str  # sizes.WEIGHTS
    plan: MemoryPlan
    sizes: tuple  # the ComponentSizes it was planned from
    run_seconds: float  # see the module docstring
    files: tuple = ()  # "folder/name" under models/ of each file to get (shipped configurations only)

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def to_json(self) -> dict:
        return {"weights": self.weights, "memory": self.plan.memory, "fits": self.fits,
                "peak_device_bytes": self.plan.peak_device_bytes, "peak_host_bytes": self.plan.peak_host_bytes,
                "prefetch": self.plan.prefetch, "vae_tiling": self.plan.vae_tiling,
                "run_seconds": round(self.run_seconds, 2), "files": list(self.files)}


@dataclass(frozen=True)
class Ranking:
    device: str  # "cuda" or "cpu"
    vram_gib: float | None  # None on the CPU
    ram_gib: float | None  # None: host memory not checked
    fitting: tuple  # Choices that fit, fastest first
    others: tuple  # Choices that do not fit
    smallest_machine: str = ""  # when nothing fits: the least memory that makes something fit, checked
    unnarrowed: str = ""  # when nothing fits under --weights/--memory: the fastest choice without them, if any

    @property
    def detail(self) -> Choice:
        """The choice shown in detail: the fastest that fits, or the one that needs the least memory, with a
        reason that says which and why."""
        if self.fitting:
            best = self.fitting[0]
            described = (f"memory={best.plan.memory}: peak {best.plan.peak_device_bytes / GIB:.1f} GiB of RAM "
                         f"({self.ram_gib:.1f} free)" if self.device == "cpu" else describe_plan(best.plan))
            return replace(best, plan=replace(best.plan, reason=(
                f"the fastest of {len(self.fitting)} that fit: --weights {best.weights} {described}")))
        least = self.others[0]
        words = [f"nothing fits: the least any choice needs is --weights {least.weights} memory={least.plan.memory}, "
                 f"{self._shortfall(least.plan)}", self.unnarrowed, self.smallest_machine]
        return replace(least, plan=replace(least.plan, reason="; ".join(w for w in words if w)))

    def _shortfall(self, plan: MemoryPlan) -> str:
        if self.device == "cpu":  # planned with the RAM as the device's memory
            return f"{plan.peak_device_bytes / GIB:.1f} GiB of RAM ({self.ram_gib:.1f} free)"
        return shortfall(plan)

    def to_json(self) -> dict:
        return {"device": self.device, "vram_gib": self.vram_gib, "ram_gib": self.ram_gib,
                "host_checked": self.ram_gib is not None or self.device == "cpu",
                "choices": [c.to_json() for c in self.fitting + self.others],
                "smallest_machine": self.smallest_machine}


def rank_choices(model, *, vram_gib: float | None, ram_gib: float | None, device: str = "cuda",
                 dtype: str = "bfloat16", weights=None, memory: str = "auto") -> Ranking:
    """Every (storage, memory plan) of ``model`` (a shipped configuration name or a diffusers folder) planned on
    the stated machine; ``weights``/``memory`` narrow the candidates to one storage or one plan. On the CPU
    (``device="cpu"``) ``ram_gib`` is all there is and ``vram_gib`` is unused."""
    stored = {w: component_sizes(model, dtype=dtype, weights=w) for w in ([weights] if weights else WEIGHTS)}
    names = published_files(model)
    if names is not None:  # a shipped configuration: only what is published can be downloaded
        stored = {w: s for w, s in stored.items() if _files(names, s, w) is not None} or stored
    plans = [memory] if memory != "auto" else list(MEMORY_PLANS[1:])
    choices = [Choice(w, plan, tuple(sizes), run_seconds(plan, sizes, w, device),
                      _files(names, sizes, w) or () if names else ())
               for w, sizes in stored.items() for plan in _plans(sizes, vram_gib, ram_gib, device, plans)]
    if not choices:  # a plan this model or machine has no use for: bad input, as an unknown plan is
        where = " on the CPU (its RAM is the device's memory)" if device == "cpu" else ""
        raise ModelLoadError(f"memory={memory} does not apply to {model}{where}; leave --memory out to try every "
                             "plan that does")
    fitting = sorted((c for c in choices if c.fits), key=_speed_order)
    others = sorted((c for c in choices if not c.fits), key=lambda c: _need(c.plan))
    smallest = unnarrowed = ""
    if not fitting:
        smallest = smallest_machine(stored, vram_gib, ram_gib, device, plans)
        if weights or memory != "auto":
            wider = rank_choices(model, vram_gib=vram_gib, ram_gib=ram_gib, device=device, dtype=dtype)
            flags = " ".join(f for f in (f"--weights {weights}" if weights else "",
                                         f"--memory {memory}" if memory != "auto" else "") if f)
            unnarrowed = f"without {flags}: {_described(wider.fitting[0])}" if wider.fitting else ""
    return Ranking(device, vram_gib if device != "cpu" else None, ram_gib, tuple(fitting), tuple(others), smallest,
                   unnarrowed)


def _plans(sizes, vram_gib, ram_gib, device: str, names: list) -> list[MemoryPlan]:
    """The plans of ``names`` that apply to the model, evaluated on the machine. On the CPU the device memory IS
    the host's: a plan counts only where it keeps nothing a second time (no streamed blocks, no host copy of a
    staged component that cannot be re-read from its file), and it needs its device peak of the RAM."""
    if device == "cpu":
        candidates = plan_candidates(sizes, device_free_bytes=int(ram_gib * GIB), host_free_bytes=None)
        by_name = {s.name: s for s in sizes}
        return [plan for name, plan in candidates.items() if name in names and name in CPU_PLANS
                and all(place != "blocks" and (place not in ("swap", "on_demand") or by_name[c].file_backed)
                        for c, place in plan.placement.items())]
    host = None if ram_gib is None else int(ram_gib * GIB)
    candidates = plan_candidates(sizes, device_free_bytes=int(vram_gib * GIB), host_free_bytes=host)
    return [plan for name, plan in candidates.items() if name in names]


def _speed_order(choice: Choice) -> tuple:
    """Fastest first; on a tie the storage closer to the original, then the cheaper plan."""
    return (round(choice.run_seconds, 6), WEIGHTS.index(choice.weights), MEMORY_PLANS.index(choice.plan.memory))


def _need(plan: MemoryPlan) -> tuple:
    return (plan.peak_device_bytes + plan.peak_host_bytes, plan.peak_device_bytes)


def run_seconds(plan: MemoryPlan, sizes, weights: str, device: str = "cuda") -> float:
    """Expected seconds a reference run spends moving and converting weights (see the module docstring)."""
    denoisers = [s for s in sizes if s.role in DENOISER_ROLES and plan.placement.get(s.name) != "host"]
    if device == "cpu":  # staged components are re-read from their files once per run
        moved = sum(s.bytes for s in sizes if plan.placement.get(s.name) in ("swap", "on_demand"))
        seconds = moved / DISK_BYTES_PER_S
    else:
        seconds = sum(_moved_per_run(s, plan, len(denoisers)) for s in sizes) / BUS_BYTES_PER_S
    if denoisers and weights != "bf16":
        rate = UPCAST_BYTES_PER_S if weights == "fp8" else (
            DEQUANT_K_BYTES_PER_S if weights.endswith("_k") else DEQUANT_BYTES_PER_S)
        seconds += REFERENCE_STEPS * max(s.parameters for s in denoisers) * 2 / rate
    return seconds


def _moved_per_run(size, plan: MemoryPlan, denoisers: int) -> float:
    """Bytes one component sends to the device in a reference run (denoisers share the steps evenly)."""
    place = plan.placement.get(size.name, "device")
    if place in ("device", "host"):
        return 0
    if size.role not in DENOISER_ROLES:  # an encoder (or VAE) comes over for its phase
        return size.bytes
    if place == "blocks":
        return REFERENCE_STEPS / denoisers * size.blocks_bytes
    if place == "swap" and plan.prefetch:  # the switch overlaps the other expert's steps
        return size.bytes / 2
    return size.bytes


def smallest_machine(stored: dict, vram_gib, ram_gib, device: str, plans: list) -> str:
    """When nothing fits: "with 32 GiB of RAM, q4_k fits (offload_blocks, ...)" for the least host memory at
    the stated device memory, and the least device memory at the stated host memory; each checked by planning
    that machine. On the CPU: the least RAM."""
    sentences = []
    if device == "cpu":
        found = _least(stored, lambda gib: (None, gib), ram_gib, device, plans)
        return f"with {found[0]} GiB of RAM, {_described(found[1])}" if found else ""
    if ram_gib is not None:
        found = _least(stored, lambda gib: (vram_gib, gib), ram_gib, device, plans)
        if found:
            sentences.append(f"with {found[0]} GiB of RAM, {_described(found[1])}")
    found = _least(stored, lambda gib: (gib, ram_gib), vram_gib, device, plans)
    if found:
        sentences.append(f"with {found[0]} GiB of device memory, {_described(found[1])}")
    return "; or ".join(sentences)


def _least(stored: dict, machine, stated_gib: float, device: str, plans: list):
    """(GiB, fastest Choice) at the least whole number of GiB above ``stated_gib`` where something fits
    (``machine(gib)`` -> (vram, ram)), or None up to ``MAX_SEARCH_GIB``. More memory never unfits a plan, so
    the first whole GiB that fits is the least."""
    for gib in range(math.floor(stated_gib) + 1, MAX_SEARCH_GIB + 1):
        vram, ram = machine(gib)
        fitting = [Choice(w, plan, tuple(sizes), run_seconds(plan, sizes, w, device))
                   for w, sizes in stored.items() for plan in _plans(sizes, vram, ram, device, plans) if plan.fits]
        if fitting:
            return gib, min(fitting, key=_speed_order)
    return None


def _described(choice: Choice) -> str:
    return (f"{choice.weights} fits ({choice.plan.memory}: {choice.plan.peak_device_bytes / GIB:.1f} GiB device, "
            f"{choice.plan.peak_host_bytes / GIB:.1f} GiB host)")


def files_of(model, weights: str, dtype: str = "bfloat16") -> tuple | None:
    """The published files of a shipped configuration stored as ``weights`` (``--weights`` without a machine to
    rank for), or None when one of them is not published."""
    names = published_files(model)
    return _files(names, component_sizes(model, dtype=dtype, weights=weights), weights) if names else None


def _files(names: dict, sizes, weights: str) -> tuple | None:
    """The files to get for ``weights``, or None when one of them is not published."""
    files = []
    for size in sizes:
        kind = stored_as(size.role, weights)
        key = "gguf" if kind in GGUF_WEIGHTS else kind
        name = names.get(size.name, {}).get(key)
        if name is None:
            return None
        files.append(name.replace(QUANT, GGUF_FILE_TYPES.get(weights, "")))
    return tuple(files)
