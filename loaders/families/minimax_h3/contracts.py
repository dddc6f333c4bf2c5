"""MiniMax-H3 sampling contracts: Turbo (file name), native FlashGen (metadata), checkpoint-pinned (model_index).

Why a module of its own: MiniMax-H3 artifacts pin *two* schedules (video and audio), a task and a DiT partition,
and the rules that combine them (``resolve_schedule``) are specific to this family. Every number and rule comes
from the published artifacts and their reference loaders (vllm-omni ``minimax_h3/lora.py`` and
``pipeline_minimax_h3.py``, LightX2V's H3 scheduler, ModelTC's inference script), unified:

* "steps" always counts denoiser evaluations (intervals); a schedule of N steps has N + 1 sigma points.
* Turbo ``…_<N>step…`` → N evaluations; ``_768p`` → video flow_shift 6, otherwise 12; audio flow_shift 3.
* A Turbo file without an ``alpha`` in its metadata runs at alpha 8 (LightX2V's reference ``--lora-alpha``
  default), NOT at alpha = rank as diffusers' ``MiniMaxH3LoraLoaderMixin`` assumes: that would drive the v0.1
  artifacts 16x too hard.
* A pinned ``base_schedule`` (checkpoint or native adapter) is shifted by the checkpoint's
  ``sigma_shift_scales`` (video 12, audio 3 unless the checkpoint says otherwise).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from typing import Optional

from ...contract_types import MAX_STEPS, ScheduleContract
from ...contracts.distill_names import quoted_words
from ...contracts.sigmas import shift_schedule, shifted_sigmas, validate_schedule
from ...errors import ContractError

FAMILY_ID = "minimax_h3"

TURBO_KEY_FORMAT = "minimax-h3-diffusers"
NATIVE_KEY_FORMAT = "minimax-h3-native"
NATIVE_QKV_LAYOUT = "grouped"

TURBO_DEFAULT_ALPHA = 8.0
TURBO_VIDEO_SHIFT_768P = 6.0
TURBO_VIDEO_SHIFT_544P = 12.0
TURBO_AUDIO_SHIFT = 3.0
DEFAULT_VIDEO_SHIFT = 12.0  # checkpoint default when model_index.json declares no sigma_shift_scales
DEFAULT_AUDIO_SHIFT = 3.0

TASKS = ("t2va", "fl2va", "ref2va")
DEFAULT_TASK = "t2va"
TASKS_BY_TURBO_FAMILY = {"fl2v": ("t2va", "fl2va"), "ref2v": ("ref2va",)}
# One repository holds two DiT partitions: T2VA/FL2VA run on ``transformer``, Ref2VA on ``transformer_ref``.
PARTITION_BY_TASK = {"t2va": "transformer", "fl2va": "transformer", "ref2va": "transformer_ref"}

TURBO_NAME_PATTERN = re.compile(
    r"^minimax_h3_(?P<task_family>fl2v|ref2v)_turbo_(?P<steps>\d+)step_v(?P<version>\d+\.\d+)"
    r"(?P<res>_768p)?(?:_bf16)?\.safetensors$"
)
TURBO_GRAMMAR = "minimax_h3_<fl2v|ref2v>_turbo_<N>step_v<x.y>[_768p][_bf16].safetensors"
# ComfyUI (fused-QKV) exports: LightX2V's ``_comfyui`` files and Kijai's ``_comfy`` repack.
_COMFY_MARKER = re.compile(r"_comfy(?:ui)?(?=[_.])")


def parse_turbo_name(file_name: str) -> Optional[dict]:
    """The Turbo name grammar's fields (task_family, steps, version, is_768p), or None if the name does not parse
    (a step count no sampler can run, above ``MAX_STEPS``, does not: its table is never built)."""
    match = TURBO_NAME_PATTERN.match(file_name)
    if match is None or not 1 <= int(match["steps"]) <= MAX_STEPS:
        return None
    return {
        "task_family": match["task_family"],
        "steps": int(match["steps"]),
        "version": match["version"],
        "is_768p": match["res"] is not None,
    }


def _refuse_comfy_export(file_name: str) -> None:
    if not (file_name.startswith("minimax_h3_") and _COMFY_MARKER.search(file_name)):
        return
    diffusers_name = _COMFY_MARKER.sub("", file_name).replace("_lightx2v_", "_")
    hint = f" ({diffusers_name})" if parse_turbo_name(diffusers_name) else ""
    raise ContractError(
        f"{file_name} is a ComfyUI-layout (fused QKV) MiniMax-H3 Turbo export, which lorabind does not load: its "
        f"sampler contract and Q/K/V layout cannot be verified. Download the diffusers export of the same "
        f"artifact{hint} from lightx2v/Minimax-h3-Turbo instead."
    )


def _positive_number(raw, file_name: str, field: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ContractError(f"{file_name}: metadata {field}={quoted_words(str(raw))} must be numeric") from None
    if not math.isfinite(value) or value <= 0:
        raise ContractError(f"{file_name}: metadata {field}={quoted_words(str(raw))} must be a positive number")
    return value


def turbo_alpha(file_name: str, metadata: dict) -> float:
    """Metadata ``alpha``, else 8 (the LightX2V reference default; diffusers would use alpha = rank, 16x stronger)."""
    raw = (metadata or {}).get("alpha")
    return TURBO_DEFAULT_ALPHA if raw in (None, "") else _positive_number(raw, file_name, "alpha")


def refuse_unverifiable(file_name: str, metadata: dict) -> None:
    """ContractError for a Turbo-family file whose contract or layout cannot be known: a ComfyUI fused-QKV export
    (refused by name) or a file with Turbo metadata under a name outside the grammar. Called when reading a
    contract AND when preparing keys for binding, so no path (fuse, adapter, merge) binds such a file."""
    if parse_turbo_name(file_name) is not None:
        return
    _refuse_comfy_export(file_name)
    if (metadata or {}).get("key_format") == TURBO_KEY_FORMAT:
        raise ContractError(
            f"{file_name!r} carries MiniMax-H3 Turbo metadata (key_format={TURBO_KEY_FORMAT!r}) but its name "
            f"does not follow {TURBO_GRAMMAR}, so its sampler contract (steps, flow_shift) cannot be "
            f"determined. Keep the published file name."
        )


def turbo_contract(file_name: str, metadata: dict, rank: Optional[int]) -> Optional[ScheduleContract]:
    """The contract a LightX2V Turbo artifact declares by its name; None when the file is not a Turbo artifact."""
    metadata = metadata or {}
    key_format = metadata.get("key_format")
    refuse_unverifiable(file_name, metadata)
    spec = parse_turbo_name(file_name)
    if spec is None:
        return None
    if key_format not in (None, "", TURBO_KEY_FORMAT):
        raise ContractError(
            f"{file_name} is named as a MiniMax-H3 Turbo artifact but its safetensors metadata declares "
            f"key_format={key_format!r}; expected {TURBO_KEY_FORMAT!r}"
        )
    steps = spec["steps"]
    video_shift = TURBO_VIDEO_SHIFT_768P if spec["is_768p"] else TURBO_VIDEO_SHIFT_544P
    tasks = TASKS_BY_TURBO_FAMILY[spec["task_family"]]
    return ScheduleContract(
        source=file_name,
        kind="turbo",
        family=FAMILY_ID,
        steps=steps,
        sigmas=shifted_sigmas(steps, video_shift),
        shift=video_shift,
        audio_sigmas=shifted_sigmas(steps, TURBO_AUDIO_SHIFT),
        audio_shift=TURBO_AUDIO_SHIFT,
        tasks=tasks,
        partition=PARTITION_BY_TASK[tasks[0]],
        alpha=turbo_alpha(file_name, metadata),
        declared_by="file name",
        rank=rank,
        extra=(("task_family", spec["task_family"]), ("version", spec["version"])),
    )


def parse_base_schedule(raw, source: str) -> tuple[float, ...]:
    """A ``base_schedule`` from metadata (comma string) or JSON (list), validated: 1.0 → 0.0, strictly decreasing."""
    if isinstance(raw, dict):
        raise ContractError(f"{source}: base_schedule must be a sequence of sigma points, not a mapping")
    if isinstance(raw, str):
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        if not parts:
            raise ContractError(f"{source}: base_schedule must not be empty")
        raw = parts
    try:
        return validate_schedule([float(p) for p in raw], source)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{source}: base_schedule is malformed: {exc}") from None


def native_contract(file_name: str, metadata: dict, rank: Optional[int]) -> ScheduleContract:
    """The contract of a native FlashGen adapter (``key_format=minimax-h3-native``), read from its metadata."""
    metadata = metadata or {}
    if metadata.get("qkv_layout") != NATIVE_QKV_LAYOUT:
        raise ContractError(
            f"{file_name}: a MiniMax-H3 native LoRA requires safetensors metadata qkv_layout={NATIVE_QKV_LAYOUT!r}, "
            f"got {metadata.get('qkv_layout')!r}"
        )
    for field in ("lora_rank", "lora_alpha", "tasks", "base_schedule"):
        if metadata.get(field) in (None, ""):
            raise ContractError(f"{file_name}: a MiniMax-H3 native LoRA requires safetensors metadata {field}")
    declared_rank = _positive_number(metadata["lora_rank"], file_name, "lora_rank")
    alpha = _positive_number(metadata["lora_alpha"], file_name, "lora_alpha")
    if rank is not None and int(declared_rank) != rank:
        raise ContractError(f"{file_name}: metadata lora_rank={metadata['lora_rank']} but the tensors have rank {rank}")
    tasks = tuple(t.strip() for t in str(metadata["tasks"]).split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise ContractError(f"{file_name}: metadata tasks={metadata['tasks']!r} names no known task {list(TASKS)}")
    base = parse_base_schedule(metadata["base_schedule"], file_name)
    return ScheduleContract(
        source=file_name,
        kind="native",
        family=FAMILY_ID,
        steps=len(base) - 1,
        tasks=tasks,
        partition=PARTITION_BY_TASK[tasks[0]],
        base_schedule=base,
        alpha=alpha,
        rank=int(declared_rank),
        declared_by="metadata",
    )


def declared_contract(file_name: str, metadata: dict, rank: Optional[int],
                      table=None) -> Optional[ScheduleContract]:
    """Turbo (by name) or native (by ``key_format``) contract; None for other files; ContractError if refused.

    ``file_name`` may be relative to the loras root (``turbo/minimax_h3_….safetensors``): the published grammar
    is about the file's own name, so only that is parsed and named in messages. A contract table entry
    (``table``) is refused: a MiniMax-H3 contract is two schedules, a task and an alpha, which the table's
    ``steps/shift/cfg`` words cannot say, and silently ignoring the user's entry would be worse.
    """
    file_name = os.path.basename(str(file_name).replace("\\", "/"))
    if table is not None:
        raise ContractError(f"{table.where}: {file_name} is a MiniMax-H3 adapter, whose contract comes from its "
                            f"published name or its metadata; a contract table entry cannot declare one (narrow "
                            f"the pattern so it does not match this file)")
    if (metadata or {}).get("key_format") == NATIVE_KEY_FORMAT:  # the metadata wins over a Turbo-like name
        contract = native_contract(file_name, metadata, rank)
        if parse_turbo_name(file_name) is not None:
            contract = replace(contract, note="its file name follows the Turbo grammar; the native metadata wins")
        return contract
    return turbo_contract(file_name, metadata, rank)


def release_info(model_index: dict) -> dict:
    """``model_index.json["_minimax_h3"]`` (the merged-release block), or {}."""
    release = (model_index or {}).get("_minimax_h3") or {}
    return release if isinstance(release, dict) else {}


def checkpoint_shifts(model_index: dict) -> tuple[float, float]:
    """(video, audio) flow shifts the checkpoint declares in ``sigma_shift_scales``, else 12 and 3."""
    scales = release_info(model_index).get("sigma_shift_scales") or {}
    return float(scales.get("video", DEFAULT_VIDEO_SHIFT)), float(scales.get("audio", DEFAULT_AUDIO_SHIFT))


def checkpoint_contract(model_index: dict, model_name: str) -> Optional[ScheduleContract]:
    """A ``base_schedule`` pinned by a merged (distilled) release; it serves the ``transformer`` partition only."""
    release = release_info(model_index)
    if "base_schedule" not in release:
        return None
    base = parse_base_schedule(release["base_schedule"], model_name)
    video_shift, audio_shift = checkpoint_shifts(model_index)
    tasks = tuple(release.get("tasks") or TASKS_BY_TURBO_FAMILY["fl2v"])
    return ScheduleContract(
        source=model_name,
        kind="pinned",
        family=FAMILY_ID,
        steps=len(base) - 1,
        sigmas=shift_schedule(base, video_shift),
        shift=video_shift,
        audio_sigmas=shift_schedule(base, audio_shift),
        audio_shift=audio_shift,
        tasks=tasks,
        partition="transformer",
        base_schedule=base,
        declared_by="checkpoint",
    )


def on_checkpoint(contract: ScheduleContract, model_index: dict) -> ScheduleContract:
    """A native contract completed for one checkpoint: its ``base_schedule`` shifted by that checkpoint's
    ``sigma_shift_scales``, so the SCHEDULE a node outputs carries both sigma lists and shifts. Other contracts
    already carry their own and are returned as they are."""
    if contract.kind != "native" or contract.sigmas is not None:
        return contract
    video_shift, audio_shift = checkpoint_shifts(model_index)
    return replace(
        contract,
        shift=video_shift,
        sigmas=shift_schedule(contract.base_schedule, video_shift),
        audio_shift=audio_shift,
        audio_sigmas=shift_schedule(contract.base_schedule, audio_shift),
    )


def with_scale(contract: ScheduleContract, scale: float, task: Optional[str] = None) -> ScheduleContract:
    """The contract as attached by a node: the adapter's scale and, optionally, the task the user picked."""
    extra = tuple(kv for kv in contract.extra if kv[0] != "task")
    if task:
        extra += (("task", task),)
    return replace(contract, scale=float(scale), extra=extra)


def file_scale(contract: ScheduleContract) -> Optional[float]:
    """alpha / rank: the factor the file's own ``B @ A`` is applied at before any request scale."""
    if contract.alpha is None or not contract.rank:
        return None
    return contract.alpha / contract.rank


def contract_dict(contract: ScheduleContract) -> dict:
    """JSON-able view for ``inspect --json`` and node UIs.

    ``scale`` is the artifact's own alpha / rank (what ``inspect`` reports for the file); ``request_scale`` is the
    multiplier a node attached it at (None when only inspected) and ``effective_scale`` their product.
    """
    steps = contract.steps
    scale = file_scale(contract)
    effective = None if scale is None or contract.scale is None else scale * contract.scale
    return {
        "source": contract.source,
        "kind": contract.kind,
        "steps": steps,
        "sigma_points": None if steps is None else steps + 1,
        "flow_shift": contract.shift,
        "audio_flow_shift": contract.audio_shift,
        "tasks": list(contract.tasks or ()),
        "partition": contract.partition,
        "alpha": contract.alpha,
        "rank": contract.rank,
        "scale": scale,
        "request_scale": contract.scale,
        "effective_scale": effective,
        "base_schedule": None if contract.base_schedule is None else list(contract.base_schedule),
        "sigmas": None if contract.sigmas is None else list(contract.sigmas),
        "audio_sigmas": None if contract.audio_sigmas is None else list(contract.audio_sigmas),
        "declared_by": contract.declared_by,
        "note": contract.note,
    }


def describe_contract(contract: ScheduleContract) -> str:
    """One sentence in words, for the node UI."""
    steps = contract.steps
    words = f"{contract.source}: {contract.kind} contract, {steps} denoiser evaluations ({steps + 1} sigma points)"
    if contract.shift is not None:
        words += f", flow_shift={contract.shift:g}, audio_flow_shift={contract.audio_shift:g}"
    if contract.base_schedule is not None:
        words += f", base_schedule={list(contract.base_schedule)}"
    words += f", tasks={','.join(contract.tasks or ())} on {contract.partition}"
    if contract.alpha is not None:
        words += f", alpha={contract.alpha:g}"
        scale = file_scale(contract)
        if scale is not None:
            words += f" (rank {contract.rank}: delta scale {scale:g}"
            words += f" x {contract.scale:g})" if contract.scale is not None else ")"
    if contract.declared_by:
        words += f" (declared by its {contract.declared_by})"
    return f"{words}; {contract.note}" if contract.note else words


def step_count_words(steps: int) -> str:
    """"a 4-step", "an 8-step", "an 11-step": the article a spoken number takes."""
    spoken_vowel = str(steps).startswith("8") or steps in (11, 18)
    return f"{'an' if spoken_vowel else 'a'} {steps}-step"


def file_contract(path) -> Optional[ScheduleContract]:
    """The contract a LoRA file declares, reading only its safetensors header (metadata and one lora_A's rank)."""
    from safetensors import safe_open

    name = os.path.basename(str(path))
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        down_keys = [k for k in handle.keys() if ".lora_A." in k or ".lora_down." in k]
        rank = handle.get_slice(down_keys[0]).get_shape()[0] if down_keys else None
    return declared_contract(name, metadata, rank)
