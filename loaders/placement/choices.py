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

Ties go to the storage closer to the original (``WEIGHTS`` order, then the bf16 text encoder). Quality is not
ranked: q4 files lose detail that bf16 and fp8 keep; the text says which storage each choice uses.

The machine (``Machine``) is the memory the user states less the headroom kept free (``headroom``: the CUDA
context, the desktop and other programs, the OS), the size the model makes (its native size, or
``--width/--height``), and how many ranks share its host memory (``plan --parallel ulysses=N``: each rank holds
the whole model, so host memory is checked against all of them together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import ModelLoadError
from .headroom import GIB, Headroom, machine_headroom
from .planner import MEMORY_PLANS, MemoryPlan, default_activation_bytes, describe_plan, plan_candidates, shortfall
from .sizes import DENOISER_ROLES, WEIGHTS
from .storages import Storage, storages

REFERENCE_STEPS = 20
BUS_BYTES_PER_S = 32e9
DISK_BYTES_PER_S = 2e9
UPCAST_BYTES_PER_S = 500e9
DEQUANT_BYTES_PER_S = 150e9
DEQUANT_K_BYTES_PER_S = 100e9
CPU_PLANS = ("full", "swap_experts", "offload_model")  # streaming blocks to the memory they live in saves nothing
MAX_SEARCH_GIB = 1024  # the smallest machine is searched up to this much device or host memory


@dataclass(frozen=True)
class Machine:
    """What a ranking is planned on: the memory stated (GiB; ``vram_gib`` None on the CPU, ``ram_gib`` None when
    host memory is not checked), ``ranks`` processes sharing the host (``plan --parallel``), ``sequence_split``
    of them sharing each step's tokens, and the decode size ``(width, height, frames)``."""

    device: str = "cuda"
    vram_gib: float | None = None
    ram_gib: float | None = None
    reserve_vram_gib: float | None = None  # --reserve-vram: replaces ComfyUI's default reserve
    ranks: int = 1
    sequence_split: int = 1
    decode: tuple = (1280, 720, 81)
    decode_source: str = ""

    @property
    def headroom(self) -> Headroom:
        return machine_headroom(self.device, self.vram_gib, self.ram_gib, self.reserve_vram_gib)

    @property
    def device_free(self) -> int:
        """Bytes a plan may use on the device (on the CPU: of the RAM, which is the device's memory)."""
        if self.device == "cpu":
            return self.headroom.usable(self.ram_gib, self.headroom.host_bytes)
        return self.headroom.usable(self.vram_gib, self.headroom.device_bytes)

    @property
    def host_free(self) -> int | None:
        """Host bytes each rank may use, None when not checked (or on the CPU, where the RAM is the device's)."""
        if self.device == "cpu" or self.ram_gib is None:
            return None
        return self.headroom.usable(self.ram_gib, self.headroom.host_bytes) // self.ranks

    def stating(self, vram_gib, ram_gib) -> Machine:
        return replace(self, vram_gib=vram_gib, ram_gib=ram_gib)


@dataclass(frozen=True)
class Choice:
    storage: Storage
    plan: MemoryPlan
    run_seconds: float  # see the module docstring

    weights = property(lambda self: self.storage.weights)
    text_encoder = property(lambda self: self.storage.text_encoder)
    sizes = property(lambda self: self.storage.sizes)
    files = property(lambda self: self.storage.files)

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def to_json(self) -> dict:
        return {"weights": self.weights, "text_encoder": self.text_encoder, "memory": self.plan.memory,
                "fits": self.fits, "peak_device_bytes": self.plan.peak_device_bytes,
                "peak_host_bytes": self.plan.peak_host_bytes, "prefetch": self.plan.prefetch,
                "vae_tiling": self.plan.vae_tiling, "run_seconds": round(self.run_seconds, 2),
                "files": list(self.files)}


@dataclass(frozen=True)
class Ranking:
    machine: Machine
    fitting: tuple  # Choices that fit, fastest first
    others: tuple  # Choices that do not fit
    smallest_machine: str = ""  # when nothing fits: the least memory that makes something fit, checked
    unnarrowed: str = ""  # when nothing fits under --weights/--memory: the fastest choice without them, if any

    device = property(lambda self: self.machine.device)
    vram_gib = property(lambda self: self.machine.vram_gib if self.machine.device != "cpu" else None)
    ram_gib = property(lambda self: self.machine.ram_gib)

    @property
    def detail(self) -> Choice:
        """The choice shown in detail: the fastest that fits, or the one that needs the least memory, with a
        reason that says which and why."""
        if self.fitting:
            best = self.fitting[0]
            described = (f"memory={best.plan.memory}: peak {best.plan.peak_device_bytes / GIB:.1f} GiB of RAM "
                         f"({self.machine.device_free / GIB:.1f} usable)" if self.device == "cpu"
                         else describe_plan(best.plan, "usable"))
            return replace(best, plan=replace(best.plan, reason=(
                f"the fastest of {len(self.fitting)} that fit: --weights {best.storage.words()} {described}")))
        least = self.others[0]
        words = [f"nothing fits: the least any choice needs is --weights {least.storage.words()} "
                 f"memory={least.plan.memory}, {self.shortfall(least.plan)}", self.unnarrowed, self.smallest_machine]
        return replace(least, plan=replace(least.plan, reason="; ".join(w for w in words if w)))

    def shortfall(self, plan: MemoryPlan) -> str:
        if self.device == "cpu":  # planned with the RAM as the device's memory
            return f"{plan.peak_device_bytes / GIB:.1f} GiB of RAM ({self.machine.device_free / GIB:.1f} usable)"
        return shortfall(plan, "usable")

    def to_json(self) -> dict:
        machine = self.machine
        return {"device": self.device, "vram_gib": self.vram_gib, "ram_gib": self.ram_gib,
                "host_checked": self.ram_gib is not None or self.device == "cpu",
                "headroom": machine.headroom.to_json(), "usable_device_bytes": machine.device_free,
                "usable_host_bytes_per_rank": machine.host_free, "ranks": machine.ranks,
                "decode_size": dict(zip(("width", "height", "frames"), machine.decode)),
                "choices": [c.to_json() for c in self.fitting + self.others],
                "smallest_machine": self.smallest_machine}


def rank_choices(model, machine: Machine, *, dtype: str = "bfloat16", weights=None, text_encoder=None,
                 memory: str = "auto") -> Ranking:
    """Every (storage, memory plan) of ``model`` (a shipped configuration name or a diffusers folder) planned on
    ``machine``; ``weights``/``text_encoder``/``memory`` narrow the candidates to one storage or one plan."""
    found = storages(model, dtype, weights, text_encoder)
    plans = [memory] if memory != "auto" else list(MEMORY_PLANS[1:])
    choices = [Choice(storage, plan, run_seconds(plan, storage.sizes, storage.weights, machine.device))
               for storage in found for plan in _plans(storage.sizes, machine, plans)]
    if not choices:  # a plan this model or machine has no use for: bad input, as an unknown plan is
        where = " on the CPU (its RAM is the device's memory)" if machine.device == "cpu" else ""
        raise ModelLoadError(f"memory={memory} does not apply to {model}{where}; leave --memory out to try every "
                             "plan that does")
    fitting = sorted((c for c in choices if c.fits), key=_speed_order)
    others = sorted((c for c in choices if not c.fits), key=lambda c: _need(c.plan))
    smallest = unnarrowed = ""
    if not fitting:
        smallest = smallest_machine(found, machine, plans)
        if weights or text_encoder or memory != "auto":
            wider = rank_choices(model, machine, dtype=dtype)
            flags = " ".join(f for f in (f"--weights {weights}" if weights else "",
                                         f"--text-encoder {text_encoder}" if text_encoder else "",
                                         f"--memory {memory}" if memory != "auto" else "") if f)
            unnarrowed = f"without {flags}: {_described(wider.fitting[0])}" if wider.fitting else ""
    return Ranking(machine, tuple(fitting), tuple(others), smallest, unnarrowed)


def _plans(sizes, machine: Machine, names: list) -> list[MemoryPlan]:
    """The plans of ``names`` that apply to the model, evaluated on the machine. On the CPU the device memory IS
    the host's: a plan counts only where it keeps nothing a second time (no streamed blocks, no host copy of a
    staged component that cannot be re-read from its file), and it needs its device peak of the RAM."""
    options = {"activation_bytes": default_activation_bytes(sizes) // machine.sequence_split,
               "decode_size": machine.decode}
    if machine.device == "cpu":
        candidates = plan_candidates(sizes, device_free_bytes=machine.device_free, host_free_bytes=None, **options)
        by_name = {s.name: s for s in sizes}
        return [plan for name, plan in candidates.items() if name in names and name in CPU_PLANS
                and all(place != "blocks" and (place not in ("swap", "on_demand") or by_name[c].file_backed)
                        for c, place in plan.placement.items())]
    candidates = plan_candidates(sizes, device_free_bytes=machine.device_free, host_free_bytes=machine.host_free,
                                 **options)
    return [plan for name, plan in candidates.items() if name in names]


def _speed_order(choice: Choice) -> tuple:
    """Fastest first; on a tie the storage closer to the original, then the cheaper plan."""
    return (round(choice.run_seconds, 6), choice.storage.order(), MEMORY_PLANS.index(choice.plan.memory))


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


def smallest_machine(found: list, machine: Machine, plans: list) -> str:
    """When nothing fits: "with 32 GiB of RAM, q4_k fits (offload_blocks, ...)" for the least host memory at
    the stated device memory, and the least device memory at the stated host memory; each checked by planning
    that machine (headroom included). On the CPU: the least RAM."""
    if machine.device == "cpu":
        found_at = _least(found, lambda gib: machine.stating(None, gib), machine.ram_gib, plans)
        return f"with {found_at[0]} GiB of RAM, {_described(found_at[1])}" if found_at else ""
    sentences = []
    if machine.ram_gib is not None:
        found_at = _least(found, lambda gib: machine.stating(machine.vram_gib, gib), machine.ram_gib, plans)
        if found_at:
            sentences.append(f"with {found_at[0]} GiB of RAM, {_described(found_at[1])}")
    found_at = _least(found, lambda gib: machine.stating(gib, machine.ram_gib), machine.vram_gib, plans)
    if found_at:
        sentences.append(f"with {found_at[0]} GiB of device memory, {_described(found_at[1])}")
    return "; or ".join(sentences)


def _least(found: list, machine_with, stated_gib: float, plans: list):
    """(GiB, fastest Choice) at the least whole number of GiB above ``stated_gib`` where something fits
    (``machine_with(gib)`` -> Machine), or None up to ``MAX_SEARCH_GIB``. More memory never unfits a plan, so
    the first whole GiB that fits is the least."""
    for gib in range(math.floor(stated_gib) + 1, MAX_SEARCH_GIB + 1):
        machine = machine_with(gib)
        fitting = [Choice(storage, plan, run_seconds(plan, storage.sizes, storage.weights, machine.device))
                   for storage in found for plan in _plans(storage.sizes, machine, plans) if plan.fits]
        if fitting:
            return gib, min(fitting, key=_speed_order)
    return None


def _described(choice: Choice) -> str:
    return (f"{choice.storage.words()} fits ({choice.plan.memory}: {choice.plan.peak_device_bytes / GIB:.1f} GiB "
            f"device, {choice.plan.peak_host_bytes / GIB:.1f} GiB host)")


def files_of(model, weights: str, dtype: str = "bfloat16", text_encoder: str = "bf16") -> tuple | None:
    """The published files of a shipped configuration stored as ``weights`` with that text encoder
    (``models download --weights`` without a machine to rank for), or None when one of them is not published."""
    found = [s for s in storages(model, dtype, weights=weights, text_encoder=text_encoder) if s.files]
    return found[0].files if found else None


def unfit_reasons(ranking: Ranking) -> list[str]:
    """Why each storage that fits with no plan does not: its plan that needs the least, and, when another plan
    is short of the other memory, that one too (fp8 A14B on 12 GiB: swap_experts needs a whole expert on the
    device, offload_blocks keeps both experts' blocks on the host)."""
    fitting = {c.weights for c in ranking.fitting}
    lines = []
    for weights in sorted({c.weights for c in ranking.others} - fitting, key=WEIGHTS.index):
        own = [c for c in ranking.others if c.weights == weights]
        least = min(own, key=lambda c: _need(c.plan))
        shown = [least] + [c for c in (min(own, key=lambda c: c.plan.peak_device_bytes),) if c is not least]
        lines.append(f"  {weights}: " + "; ".join(f"{c.plan.memory} needs {ranking.shortfall(c.plan)}"
                                                  for c in shown))
    return lines
