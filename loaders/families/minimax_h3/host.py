"""MiniMax-H3 contracts on a host's own model: ComfyUI 0.30's MiniMax-H3 ``MODEL`` sampled by ComfyUI's samplers.

What ComfyUI's MiniMax path does (``comfy/ldm/minimax/model.py`` and ``comfy_extras/nodes_minimax_h3.py``,
0.30.0): the sampler steps ONE sigma list, the video's (``ModelSamplingDiscreteFlow`` at ``MiniMaxH3``'s shift 12,
or what ``MiniMaxH3SigmaShift`` / ``ModelSamplingSD3`` set). The DiT derives each step's audio sigma from it in
closed form: it inverts the video shift to the shared base grid and applies the audio shift
(``time_shift_sigma``), with both shifts read from ``transformer_options`` (which only ``MiniMaxH3SigmaShift``
writes) or its own defaults 12 and 3, and scales the audio velocity by that map's slope. So the soundtrack runs
the contract's audio schedule only when the video shift the DiT is told equals the one the sampler's sigmas were
made with, and its audio shift is the contract's: ``ModelSamplingSD3`` at 6 alone gives a 768p Turbo file the
right video sigmas but an audio schedule derived as if they were shift 12's. The task is the conditioning's: ComfyUI's
reference node puts its references there, its image-to-video node its keyframes.
"""

from __future__ import annotations

from typing import Optional

from ...contracts.sigmas import TABLE_TOLERANCE, shift_schedule, sigmas_close, slice_offset
from .contracts import DEFAULT_TASK, TURBO_VIDEO_SHIFT_768P, on_checkpoint

# the transformer_options keys MiniMaxH3SigmaShift writes, and MiniMaxH3Model's defaults when none is set
HOST_VIDEO_SHIFT_OPTION = "minimax_h3_sigma_shift_video"
HOST_AUDIO_SHIFT_OPTION = "minimax_h3_sigma_shift_audio"
HOST_DEFAULT_SHIFTS = (12.0, 3.0)
# the conditioning keys ComfyUI's MiniMax-H3 nodes set, and the task each makes (nodes_minimax_h3.py, 0.30.0)
HOST_TASK_KEYS = (("minimax_refs", "ref2va"), ("minimax_keyframes", "fl2va"))


def on_host(contract):
    """A native adapter's ``base_schedule`` shifted as the host model shifts it: no ``model_index.json`` there,
    so the checkpoint defaults (video 12, audio 3, which ComfyUI's MiniMax-H3 model also uses)."""
    return on_checkpoint(contract, {})


def _unshift(sigma: float, shift: float) -> float:
    """The base-grid point a sigma of ``shift`` comes from (``shift_sigma``'s inverse)."""
    return sigma / (shift + sigma * (1.0 - shift))


def _show(sigmas) -> str:
    return "[" + ", ".join(f"{float(s):.4f}" for s in sigmas) + "]"


def explain_host_sigmas(contract, sigmas: list) -> Optional[str]:
    """"flow_shift: ..." when the sampler runs the contract's step count on another shift's table (the Turbo
    files' shift is 6 at 768p and 12 otherwise, which a user picks by resolution); None otherwise."""
    table = contract.sigmas
    if contract.shift is None or table is None or len(sigmas) != len(table) or len(table) < 3:
        return None
    base = [_unshift(float(s), contract.shift) for s in table]
    sampled, point = float(sigmas[1]), base[1]
    if not 0.0 < sampled < 1.0:
        return None
    shift = sampled * (1.0 - point) / (point * (1.0 - sampled))
    if not sigmas_close(sigmas, shift_schedule(base, shift)) or abs(shift - contract.shift) <= TABLE_TOLERANCE:
        return None
    why = ""
    if contract.kind == "turbo":
        why = " (its name says _768p)" if contract.shift == TURBO_VIDEO_SHIFT_768P else " (its name has no _768p)"
    return (f"flow_shift: it needs flow_shift={contract.shift:g}{why}, the sampler runs its {len(table) - 1} steps "
            f"on flow_shift {shift:.4g}'s sigmas {_show(sigmas)} instead of {_show(table)} (set MiniMaxH3SigmaShift "
            f"shift_video to {contract.shift:g})")


def _derived_audio(sigma: float, video_shift: float, audio_shift: float) -> float:
    """The audio sigma ComfyUI's MiniMax-H3 model runs at a video sigma (``time_shift_sigma``)."""
    base = _unshift(sigma, video_shift)
    return audio_shift * base / (1.0 + (audio_shift - 1.0) * base)


def host_task(condition_keys) -> str:
    """The task a ComfyUI MiniMax-H3 conditioning is for: its references (``MiniMaxH3ReferenceToVideo``) make it
    ref2va, its keyframes (``MiniMaxH3ImageToVideo`` with a first or last frame) fl2va, neither t2va."""
    return next((task for key, task in HOST_TASK_KEYS if key in condition_keys), DEFAULT_TASK)


def _task_problem(contract, condition_keys) -> Optional[str]:
    """"task: ..." when the conditioning's task is not one the artifact serves (as ``lorabind run`` refuses a
    ref2v Turbo file on a text-to-video latent)."""
    task = host_task(condition_keys)
    if not contract.tasks or task in contract.tasks:
        return None
    made_by = {"ref2va": "MiniMaxH3ReferenceToVideo with references", "fl2va": "MiniMaxH3ImageToVideo with a frame",
               "t2va": "no references or keyframes"}
    wanted = " or ".join(made_by[t] for t in contract.tasks if t in made_by)
    return (f"task: it serves tasks {list(contract.tasks)}, and the sampler's positive conditioning is for task "
            f"{task!r} ({made_by[task]}); condition it with {wanted}")


def host_sampling_problem(contract, sigmas: list, host_options: dict,
                          condition_keys: frozenset = frozenset()) -> Optional[str]:
    """"task: ..." when the conditioning is for another task than the artifact serves; "audio_flow_shift: ..."
    when the audio sigmas ComfyUI's model derives from these (right) video sigmas are not the contract's audio
    schedule; None when neither."""
    task_problem = _task_problem(contract, condition_keys)
    if task_problem is not None:
        return task_problem
    if contract.audio_sigmas is None or contract.sigmas is None:
        return None
    offset = slice_offset(contract.sigmas, sigmas)
    if offset is None:
        return None
    video_shift = float(host_options.get(HOST_VIDEO_SHIFT_OPTION, HOST_DEFAULT_SHIFTS[0]))
    audio_shift = float(host_options.get(HOST_AUDIO_SHIFT_OPTION, HOST_DEFAULT_SHIFTS[1]))
    derived = [_derived_audio(float(s), video_shift, audio_shift) for s in sigmas]
    wanted = contract.audio_sigmas[offset:offset + len(sigmas)]
    if sigmas_close(derived, wanted):
        return None
    return (f"audio_flow_shift: it needs the soundtrack on audio_flow_shift={contract.audio_shift:g} "
            f"{_show(wanted)}, and ComfyUI's MiniMax-H3 model derives {_show(derived)} from these video sigmas "
            f"with shift_video={video_shift:g}, shift_audio={audio_shift:g} (MiniMaxH3SigmaShift's, else the "
            f"model's defaults 12 and 3): set MiniMaxH3SigmaShift to shift_video={contract.shift:g}, "
            f"shift_audio={contract.audio_shift:g}")
