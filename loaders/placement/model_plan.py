"""``lorabind plan``'s library side: sizes of a model folder or shipped configuration, its plan, as text/JSON."""

from __future__ import annotations

from dataclasses import replace

from .choices import unfit_reasons
from .planner import DEFAULT_DECODE_SIZE, GIB, MEMORY_PLANS, MemoryPlan, default_activation_bytes, plan_memory
from .sizes import ComponentSize, component_sizes


def plan_model(model, *, vram_gib: float, ram_gib: float | None = None, memory: str = "auto",
               dtype: str = "bfloat16", weights: str = "bf16", sizes: list | None = None, sequence_split: int = 1,
               decode_size: tuple = DEFAULT_DECODE_SIZE) -> tuple[MemoryPlan, list[ComponentSize]]:
    """The memory plan for ``model`` (a diffusers folder or a shipped configuration name; ``weights`` "bf16",
    "fp8" as the published single files store them, or a GGUF type for GGUF denoisers, ``sizes.WEIGHTS``) or
    for components the caller measured (``sizes``: single files' headers, ``single_file.pipelines.files_sizes``; ``model`` is then ignored) on a device with
    ``vram_gib`` GiB free (and ``ram_gib`` GiB of host memory, unchecked when None). Reads configs and headers
    only. A plan that does not fit says what would: the same model with fp8 weights, or the least memory the
    smallest plan needs. ``sequence_split``: ranks sharing each step's tokens (``--parallel ulysses/ring``), which
    divide the denoising working memory; ``decode_size``: (width, height[, frames]) the decode is planned at."""
    measured = sizes is not None
    if not measured:
        sizes = component_sizes(model, dtype=dtype, weights=weights)
    plan = _plan(sizes, vram_gib, ram_gib, memory, sequence_split, decode_size)
    if plan.fits:
        return plan, sizes
    hint = None
    if not measured and weights == "bf16":
        fp8_plan = _plan(component_sizes(model, dtype=dtype, weights="fp8"), vram_gib, ram_gib, memory,
                         sequence_split, decode_size)
        if fp8_plan.fits:
            hint = (f"with fp8 weights (--weights fp8: ComfyUI's *_fp8_e4m3fn* single files) it fits: "
                    f"memory={fp8_plan.memory}, peak {fp8_plan.peak_device_bytes / GIB:.1f} GiB on the device, "
                    f"{fp8_plan.peak_host_bytes / GIB:.1f} GiB on the host")
    if hint is None:
        hint = least_memory_hint(sizes, model if not measured else None, dtype, weights, sequence_split)
    return replace(plan, reason=f"{plan.reason}; {hint}"), sizes


def _plan(sizes, vram_gib: float, ram_gib, memory: str, sequence_split: int = 1,
          decode_size: tuple = DEFAULT_DECODE_SIZE) -> MemoryPlan:
    host = None if ram_gib is None else int(ram_gib * GIB)
    return plan_memory(sizes, device_free_bytes=int(vram_gib * GIB), host_free_bytes=host, requested=memory,
                       activation_bytes=default_activation_bytes(sizes) // sequence_split, decode_size=decode_size)


def least_memory_hint(sizes, model, dtype: str, weights: str, sequence_split: int = 1) -> str:
    """The smallest machine that runs it: the least device and host memory a plan needs (fp8 weights when the
    model has a published fp8 form and bf16 weights are asked for); ``lorabind plan --parallel`` says it."""
    candidates = [("", sizes)]
    if model is not None and weights == "bf16":
        candidates.append((" with --weights fp8", component_sizes(model, dtype=dtype, weights="fp8")))
    best = None
    for words, candidate in candidates:
        for name in MEMORY_PLANS[1:]:
            plan = plan_memory(candidate, device_free_bytes=1 << 60, host_free_bytes=None, requested=name,
                               activation_bytes=default_activation_bytes(candidate) // sequence_split)
            if plan.fits and (best is None or _need(plan) < _need(best[1])):
                best = (words, plan)
    words, plan = best  # a machine with this much memory: more than the one asked about, so not "fits"
    return (f"the least memory any plan needs: memory={plan.memory}{words}, {plan.peak_device_bytes / GIB:.1f} GiB "
            f"of device memory and {plan.peak_host_bytes / GIB:.1f} GiB of host memory")


def _need(plan: MemoryPlan) -> tuple:
    return (plan.peak_host_bytes + plan.peak_device_bytes, plan.peak_device_bytes)


def plan_to_json(plan: MemoryPlan, sizes: list[ComponentSize]) -> dict:
    """The plan's JSON with the component sizes it was computed from."""
    data = plan.to_json()
    data["components"] = [
        {"name": s.name, "role": s.role, "bytes": s.bytes, "parameters": s.parameters,
         "largest_block_bytes": s.largest_block_bytes} for s in sizes
    ]
    return data


def format_plan(plan: MemoryPlan, sizes: list[ComponentSize], cpu: bool = False) -> str:
    """A few readable lines: the decision, then where each component lives and how large it is. ``cpu``: the
    device is the host (its peak is the RAM's)."""
    peaks = (f"peak RAM: {plan.peak_device_bytes / GIB:.1f} GiB" if cpu else
             f"peak device: {plan.peak_device_bytes / GIB:.1f} GiB, peak host: {plan.peak_host_bytes / GIB:.1f} GiB")
    lines = [f"memory: {plan.memory}  ({'fits' if plan.fits else 'DOES NOT FIT'})", f"reason: {plan.reason}",
             f"{peaks}{', tiled VAE decode' if plan.vae_tiling else ''}{', prefetch' if plan.prefetch else ''}",
             "components:"]
    for s in sizes:
        lines.append(f"  {s.name:<16} {s.role:<18} {s.bytes / GIB:7.2f} GiB  {s.parameters / 1e9:6.2f}B params  "
                     f"-> {plan.placement.get(s.name, '?')}")
    return "\n".join(lines)


SHOWN_CHOICES = 5  # the text lists this many fitting choices; --json lists them all


def unchecked_host_line(ram_gib) -> str:
    """What "fits" means without ``--ram``: the device only."""
    return "" if ram_gib is not None else "host memory: not checked (give --ram GIB to check it)"


def format_ranking(model: str, ranking) -> str:
    """``lorabind plan``'s text: the machine and the headroom kept free, what fits fastest first with the files
    to get (or the smallest machine that would fit), why the storages that fit nowhere do not, then the first
    choice in detail (``format_plan``)."""
    machine = ranking.machine
    cpu = ranking.device == "cpu"
    count = len(ranking.fitting) + len(ranking.others)
    lines = [f"{model} on {_machine_words(machine)}: "
             + (f"{len(ranking.fitting)} of {count} choices fit, fastest first (~s: moving and converting weights "
                "in a 20-step run):" if ranking.fitting
                else f"none of {count} choices fits."),
             machine.headroom.describe(ranking.device, ranking.ram_gib is not None)
             + f"; usable: {_usable_words(machine)}",
             "decode planned at {}x{}, {} frame{} ({})".format(*machine.decode, "" if machine.decode[2] == 1 else "s",
                                                               machine.decode_source)]
    for number, choice in enumerate(ranking.fitting[:SHOWN_CHOICES], 1):
        lines.append(f"  {number}. {_choice_words(choice, cpu, machine.ranks)}")
        if choice.files:
            lines.append(f"     files: {', '.join(choice.files)}")
    if len(ranking.fitting) > SHOWN_CHOICES:
        lines.append(f"  ... and {len(ranking.fitting) - SHOWN_CHOICES} more (--json lists every choice)")
    reasons = unfit_reasons(ranking)
    if reasons:
        lines += ["does not fit with any plan:", *reasons]
    lines += [line for line in (ranking.unnarrowed, ranking.smallest_machine,
                                "" if cpu else unchecked_host_line(ranking.ram_gib)) if line]
    detail = ranking.detail
    lines += ["", format_plan(detail.plan, list(detail.sizes))]
    return "\n".join(lines)


def _machine_words(machine) -> str:
    if machine.device == "cpu":
        return f"a CPU with {machine.ram_gib:g} GiB of RAM"
    per_rank = " per rank" if machine.ranks > 1 else ""
    host = "" if machine.ram_gib is None else f" and {machine.ram_gib:g} GiB of host memory" + (
        f" shared by {machine.ranks} ranks" if machine.ranks > 1 else "")
    return f"{machine.vram_gib:g} GiB of device memory{per_rank}{host}"


def _usable_words(machine) -> str:
    if machine.device == "cpu":
        return f"{machine.device_free / GIB:.1f} GiB of RAM"
    device = f"{machine.device_free / GIB:.1f} GiB device"
    if machine.host_free is None:
        return device
    ranks = f" per rank ({machine.ranks} ranks)" if machine.ranks > 1 else ""
    return f"{device}, {machine.host_free / GIB:.1f} GiB host{ranks}"


def _choice_words(choice, cpu: bool, ranks: int = 1) -> str:
    """"--weights q4_k --text-encoder fp8 memory=swap_experts: 9.1 GiB device, 22.0 GiB host, ~6.6 s" (RAM alone
    on the CPU; per rank and for all ranks when several share the host)."""
    plan = choice.plan
    prefetch = " (prefetching the next expert)" if plan.prefetch and plan.memory == "swap_experts" else ""
    host = plan.peak_host_bytes / GIB
    memory = (f"{plan.peak_device_bytes / GIB:.1f} GiB of RAM" if cpu else
              f"{plan.peak_device_bytes / GIB:.1f} GiB device, {host:.1f} GiB host"
              + (f" per rank ({ranks * host:.1f} GiB for {ranks} ranks)" if ranks > 1 else ""))
    encoder = f" --text-encoder {choice.text_encoder}" if choice.text_encoder != "bf16" else ""
    return f"--weights {choice.weights}{encoder} memory={plan.memory}{prefetch}: {memory}, ~{choice.run_seconds:.1f} s"


def ranking_to_json(ranking) -> dict:
    """The first choice's plan as ``plan_to_json`` gives it (what ``--json`` always carried), with its
    ``weights`` and the whole ranking: every choice, fitting first and fastest first."""
    detail = ranking.detail
    return {**plan_to_json(detail.plan, list(detail.sizes)), "weights": detail.weights,
            "text_encoder": detail.text_encoder, **ranking.to_json()}
