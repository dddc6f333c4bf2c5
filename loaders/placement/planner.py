"""Choose where each component lives (device, host, swapped, streamed by blocks) from sizes and free memory.

The cost model (all sizes in bytes at the dtype the model runs in):

* A run has three phases: **encode** (text/image encoders), **denoise** (the denoisers, one at a time for a
  two-expert model) and **decode** (the VAE). The device peak of a plan is the largest of the three phases.
* A component placed ``device`` is on the device in every phase (and across runs). ``on_demand`` is on the
  device only in its own phase (diffusers' model offload; text encoders while encoding). ``swap`` is a Wan2.2
  expert: on the device while its part of the schedule runs, swapped at the boundary; with ``prefetch`` the
  next expert's upload overlaps the current one's steps, which needs room for both. ``blocks`` streams the
  repeated blocks (diffusers' group offload, one block ahead prefetched): its footprint is the weights outside
  the blocks plus two blocks. ``host`` never comes to the device.
* Denoising working memory (``activation_bytes``) defaults to ``max(1 GiB, 10 % of the largest denoiser)``:
  the activations grow with the model's width, which grows with its size. Override it for very long videos.
  Encoding reserves ``ENCODE_ACTIVATION_BYTES``.
* Decoding reserves ``default_decode_bytes(width, height, frames)`` (see there) at the size asked for (``lorabind
  plan``: the model's native size, or ``--width/--height``); when that does not fit next to what stays resident,
  the plan decodes in tiles (``vae_tiling``), which needs about two tiles' worth.
* Host peak: ``swap`` and ``on_demand`` components are kept in the safetensors files they came from while they
  are not in use (``file_resident``; ``file_staging``): the inactive Wan2.2 expert is not held in host RAM, the
  text encoder is released after encoding and re-read for a new prompt (GGUF denoisers are not re-read from their
  files: ``ComponentSize.file_backed`` is False and they are held on the host). ``blocks`` and ``host`` components live
  on the host (group offload keeps their host copy). The host peak is those plus the largest component passing
  through the host at a time (loaded onto the device, or re-read from its file).

What each plan costs per run (PCIe 4.0 x16 moves a 14B bf16 expert, 28.6 GB, in about 0.9 s):
``full`` nothing; ``swap_experts`` two expert uploads (the high-noise expert at the start, the low-noise one at
the boundary; the expert that ends a run stays resident until something needs its room); ``offload_model`` one
upload of every denoiser and encoder; ``offload_blocks`` one upload of every denoiser **per step**, overlapped
with compute by prefetching.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sizes import ALTERNATE_ROLE, DENOISER_ROLES, ENCODER_ROLES, EXPERT_ROLES, ComponentSize

MEMORY_PLANS = ("auto", "full", "swap_experts", "offload_model", "offload_blocks")
PLACEMENTS = ("device", "host", "swap", "blocks", "on_demand")
_FILE_RESIDENT = ("swap", "on_demand")  # staged from the weights' files, no host copy kept
GIB = 1024**3
ENCODE_ACTIVATION_BYTES = 1 * GIB  # a 512-token prompt through a 7B encoder needs a few hundred MB
DEFAULT_DECODE_SIZE = (1280, 720)  # width, height when nothing says better: the 14B models' 720p video
# Wan-style VAEs decode causally, one latent frame (4 video frames) at a time, so the decode peak depends on the
# frame size, not on the number of frames. At full resolution the decoder carries ~96 channels; about a dozen
# such tensors (activations, the causal cache, upsampling temporaries) are alive at once in bf16.
_DECODE_FRAMES_PER_CHUNK = 4
_DECODE_CHANNELS = 96
_DECODE_LIVE_TENSORS = 12
_TILE_SIDE = 256  # diffusers' Wan VAE tile size in pixels (tile_sample_min_height/width)


def default_decode_bytes(width: int, height: int, frames: int = _DECODE_FRAMES_PER_CHUNK) -> int:
    """Device memory a VAE decode needs for frames of ``width`` x ``height`` pixels (see the module docstring);
    ``frames``: the frames made (an image model makes one), of which at most a chunk is decoded at once."""
    return width * height * _chunk(frames) * _DECODE_CHANNELS * 2 * _DECODE_LIVE_TENSORS


def _chunk(frames: int) -> int:
    return max(1, min(frames, _DECODE_FRAMES_PER_CHUNK))


def default_activation_bytes(sizes) -> int:
    """Denoising working memory when none is given: ``max(1 GiB, 10 % of the largest denoiser)`` (see the module
    docstring); ``lorabind plan --parallel`` divides it among the ranks that share the tokens."""
    return max(GIB, max((s.bytes for s in sizes if s.role in DENOISER_ROLES), default=0) // 10)


def _tiled_decode_bytes(width: int, height: int, frames: int = _DECODE_FRAMES_PER_CHUNK) -> int:
    """Tiled decode: one tile in flight plus the overlapping neighbour being blended, and the decoded chunk
    (fp32 RGB) being assembled."""
    tile = default_decode_bytes(min(width, _TILE_SIDE), min(height, _TILE_SIDE), frames)
    return 2 * tile + width * height * _chunk(frames) * 3 * 4


@dataclass(frozen=True)
class MemoryPlan:
    memory: str  # the plan chosen (one of MEMORY_PLANS except "auto")
    resident: tuple  # components on the device during denoising (at its peak)
    placement: dict = field(default_factory=dict)  # component -> one of PLACEMENTS
    vae_tiling: bool = False
    prefetch: bool = False
    peak_device_bytes: int = 0
    peak_host_bytes: int = 0
    fits: bool = True
    reason: str = ""
    device_free_bytes: int = 0
    host_free_bytes: int | None = None
    file_resident: tuple = ()  # components kept in their files while not in use (see the module docstring)

    def to_json(self) -> dict:
        return {
            "memory": self.memory, "resident": list(self.resident), "placement": dict(self.placement),
            "vae_tiling": self.vae_tiling, "prefetch": self.prefetch,
            "peak_device_bytes": self.peak_device_bytes, "peak_host_bytes": self.peak_host_bytes,
            "device_free_bytes": self.device_free_bytes, "host_free_bytes": self.host_free_bytes,
            "fits": self.fits, "reason": self.reason, "file_resident": list(self.file_resident),
        }


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _footprint(size: ComponentSize, place: str) -> int:
    """Device bytes a component occupies while it is in use under ``place``."""
    if place == "host":
        return 0
    if place == "blocks":
        block = size.largest_block_bytes or size.largest_layer_bytes
        return min(size.bytes, size.bytes - size.blocks_bytes + 2 * block)
    return size.bytes


@dataclass(frozen=True)
class _Inputs:
    sizes: tuple
    device_free: int
    host_free: int | None
    activation: int
    decode: int
    tiled_decode: int

    def by_role(self, roles) -> list[ComponentSize]:
        return [s for s in self.sizes if s.role in roles]


def _encoder_placement(inputs: _Inputs, size: ComponentSize, persistent: int) -> str:
    """Text/image encoders come to the device only while encoding; one too large even for that is streamed."""
    if persistent + size.bytes + ENCODE_ACTIVATION_BYTES <= inputs.device_free:
        return "on_demand"
    return "blocks"


def _placements(plan: str, inputs: _Inputs) -> dict | None:
    """component -> placement for ``plan``; None when the plan does not apply to this model."""
    alternates = {s.name: "host" for s in inputs.by_role((ALTERNATE_ROLE,))}
    if plan == "full":
        return {**{s.name: "device" for s in inputs.sizes}, **alternates}
    if plan == "swap_experts" and len(inputs.by_role(EXPERT_ROLES)) < 2:
        return None
    denoiser_place = {"swap_experts": "swap", "offload_model": "on_demand", "offload_blocks": "blocks"}[plan]
    placement = dict(alternates)
    for s in inputs.sizes:
        if s.role == ALTERNATE_ROLE:
            continue
        if s.role in DENOISER_ROLES:
            placement[s.name] = denoiser_place if s.role in EXPERT_ROLES or plan != "swap_experts" else "on_demand"
        elif s.role not in ENCODER_ROLES:
            placement[s.name] = "device"  # the VAE: small, and needed at both ends of a run
    persistent = sum(s.bytes for s in inputs.sizes if placement.get(s.name) == "device")
    for s in inputs.by_role(ENCODER_ROLES):
        placement[s.name] = _encoder_placement(inputs, s, persistent)
    return placement


def _evaluate(plan: str, inputs: _Inputs, placement: dict) -> MemoryPlan:
    sizes = {s.name: s for s in inputs.sizes}
    always = sum(s.bytes for s in inputs.sizes if placement[s.name] == "device")
    encoders = [_footprint(s, placement[s.name]) for s in inputs.by_role(ENCODER_ROLES)
                if placement[s.name] != "device"]
    encode_peak = always + max(encoders, default=0) + ENCODE_ACTIVATION_BYTES
    moving = [n for n, p in placement.items() if p != "device" and sizes[n].role in DENOISER_ROLES]
    in_use = max((_footprint(sizes[n], placement[n]) for n in moving), default=0)
    resident = [n for n, p in placement.items() if p == "device"]
    prefetch = plan == "offload_blocks"
    if plan == "swap_experts":
        experts = sorted((sizes[n].bytes for n in moving if placement[n] == "swap"), reverse=True)
        prefetch = always + sum(experts[:2]) + inputs.activation <= inputs.device_free
        in_use = sum(experts[:2]) if prefetch else in_use
    if moving:  # the one in use during denoising (the largest), or both experts when prefetching
        largest = max(moving, key=lambda n: sizes[n].bytes)
        resident += [n for n in moving if placement[n] == "swap"] if prefetch and plan == "swap_experts" else [largest]
    denoise_peak = always + in_use + inputs.activation
    vae_tiling = always + inputs.decode > inputs.device_free
    decode_peak = always + (inputs.tiled_decode if vae_tiling else inputs.decode)
    peak_device = max(encode_peak, denoise_peak, decode_peak)
    file_resident = tuple(n for n, p in placement.items() if p in _FILE_RESIDENT and sizes[n].file_backed)
    held = sum(sizes[n].bytes for n, p in placement.items()
               if (p in ("blocks", "host") and sizes[n].role != ALTERNATE_ROLE)
               or (p in _FILE_RESIDENT and not sizes[n].file_backed))  # staged from a host copy instead
    passing = max((sizes[n].bytes for n, p in placement.items() if p == "device" or n in file_resident), default=0)
    peak_host = held + passing
    fits = peak_device <= inputs.device_free and (inputs.host_free is None or peak_host <= inputs.host_free)
    return MemoryPlan(
        memory=plan, resident=tuple(resident), placement=placement, vae_tiling=vae_tiling, prefetch=prefetch,
        peak_device_bytes=peak_device, peak_host_bytes=peak_host, fits=fits, reason="",
        device_free_bytes=inputs.device_free, host_free_bytes=inputs.host_free, file_resident=file_resident,
    )


def shortfall(plan: MemoryPlan, free: str = "free") -> str:
    """"15.2 GiB of device memory (11.1 GiB free)"; ``free``: what the limit is called (``lorabind plan``: the
    usable memory, the stated memory less the headroom it keeps)."""
    parts = []
    if plan.peak_device_bytes > plan.device_free_bytes:
        parts.append(f"{_gib(plan.peak_device_bytes)} of device memory ({_gib(plan.device_free_bytes)} {free})")
    if plan.host_free_bytes is not None and plan.peak_host_bytes > plan.host_free_bytes:
        parts.append(f"{_gib(plan.peak_host_bytes)} of host memory ({_gib(plan.host_free_bytes)} {free})")
    return " and ".join(parts)


def describe_plan(plan: MemoryPlan, free: str = "free") -> str:
    extras = [w for w, on in (("prefetching the next expert", plan.prefetch and plan.memory == "swap_experts"),
                               ("tiled VAE decode", plan.vae_tiling)) if on]
    tail = f" ({', '.join(extras)})" if extras else ""
    return (f"memory={plan.memory}{tail}: peak {_gib(plan.peak_device_bytes)} on the device of "
            f"{_gib(plan.device_free_bytes)} {free}, {_gib(plan.peak_host_bytes)} on the host")


def plan_candidates(sizes, *, device_free_bytes: int, host_free_bytes: int | None = None,
                    activation_bytes: int | None = None, decode_size: tuple = DEFAULT_DECODE_SIZE) -> dict:
    """{plan: MemoryPlan} of every plan that applies to the model on this machine, fitting or not, cheapest
    first (``lorabind plan`` compares them all; ``plan_memory`` picks one). Reasons are left empty."""
    sizes = tuple(sizes)
    if activation_bytes is None:
        activation_bytes = default_activation_bytes(sizes)
    width, height, *frames = decode_size  # (width, height) or (width, height, frames)
    frames = frames[0] if frames else _DECODE_FRAMES_PER_CHUNK
    inputs = _Inputs(sizes, int(device_free_bytes), host_free_bytes, int(activation_bytes),
                     default_decode_bytes(width, height, frames), _tiled_decode_bytes(width, height, frames))
    candidates = {}
    for name in MEMORY_PLANS[1:]:
        placement = _placements(name, inputs)
        if placement is not None:
            candidates[name] = _evaluate(name, inputs, placement)
    return candidates


def plan_memory(sizes, *, device_free_bytes: int, host_free_bytes: int | None = None, requested: str = "auto",
                activation_bytes: int | None = None, decode_size: tuple = DEFAULT_DECODE_SIZE) -> MemoryPlan:
    """The memory plan for components of ``sizes`` given the free device (and host) memory.

    ``auto`` takes the first plan that fits, cheapest first: full, swap_experts (two-expert models),
    offload_model, offload_blocks. A requested plan that does not fit (or does not apply) comes back with
    ``fits=False`` and a reason naming what it needs, what is free and which plan would work.
    """
    if requested not in MEMORY_PLANS:
        raise ValueError(f"unknown memory plan {requested!r}; choose one of {list(MEMORY_PLANS)}")
    candidates = plan_candidates(sizes, device_free_bytes=device_free_bytes, host_free_bytes=host_free_bytes,
                                 activation_bytes=activation_bytes, decode_size=decode_size)
    working = [p for p in candidates.values() if p.fits]
    if requested == "auto":
        chosen = working[0] if working else candidates["offload_blocks"]
        if chosen.fits:
            return _with_reason(chosen, f"auto chose {describe_plan(chosen)}")
        return _with_reason(chosen, f"nothing fits: the smallest plan, offload_blocks, needs {shortfall(chosen)}")
    smallest = candidates["offload_blocks"]
    alternative = (f"memory={working[0].memory} would fit (peak {_gib(working[0].peak_device_bytes)})" if working
                   else f"no plan fits (the smallest, offload_blocks, needs {shortfall(smallest)})")
    if requested not in candidates:
        fallback = candidates["offload_model"]
        return MemoryPlan(
            memory=requested, resident=fallback.resident, placement=fallback.placement, fits=False,
            peak_device_bytes=fallback.peak_device_bytes, peak_host_bytes=fallback.peak_host_bytes,
            device_free_bytes=fallback.device_free_bytes, host_free_bytes=fallback.host_free_bytes,
            reason=f"memory=swap_experts needs a model with two experts (high and low noise); {alternative}",
        )
    chosen = candidates[requested]
    if chosen.fits:
        return _with_reason(chosen, f"requested {describe_plan(chosen)}")
    return _with_reason(chosen, f"memory={requested} needs {shortfall(chosen)}; {alternative}")


def _with_reason(plan: MemoryPlan, reason: str) -> MemoryPlan:
    from dataclasses import replace

    return replace(plan, reason=reason)
