"""MiniMax-H3 use cases. ``check_contract``: attach an adapter that declares its own schedule (Turbo / native)
and say what the sampler will have to run; the soundtrack and the first-frame anchor.

Why a use case: composing the contract is a rule, not a node's job: the artifact's contract (from its published
name or metadata), bound to the checkpoint it runs on, scaled, for the chosen task, and resolved once so the
request the sampler will see is known (and refused) before anything is sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..loaders.dispatch.contract_discovery import SamplingRequest
from ..loaders.errors import LoraBindError
from ..loaders.families import family_by_id
from ..loaders.handles import AdapterSpec, ScheduleHandle

# The family these use cases serve (MiniMax-H3's own nodes call them), reached through the registry and its parts
MINIMAX_H3 = family_by_id("minimax_h3")
TASKS = MINIMAX_H3.contracts.tasks
MAX_REFERENCE_IMAGES = MINIMAX_H3.sampling.max_references


@dataclass(frozen=True)
class CheckedContract:
    handle: object  # the model handle with the adapter attached
    schedule: ScheduleHandle  # the adapter's contract, for the sampler's schedule input
    sigmas: tuple  # the video sigmas the contract implies
    view: dict  # the contract as the UI shows it
    text: list  # what the node reports


def check_contract(model, lora_name: str, path_of: Callable[[], str], scale: float, task: str, *,
                   where: str) -> CheckedContract:
    """The adapter (its file found by ``path_of()``) attached to ``model`` with its contract; ``task`` "auto" is
    the artifact's first task. Refuses, naming ``where``, a model of another family (before looking for the
    file) and a file that declares no contract."""
    if not MINIMAX_H3.serves(model):
        raise LoraBindError(f"{where}: {lora_name} is a MiniMax-H3 adapter, but model {model.model.name} is "
                            f"{model.family}")
    path = path_of()
    contract = MINIMAX_H3.contracts.adapter_contract(path)
    if contract is None:
        raise LoraBindError(
            f"{where}: {lora_name} declares no MiniMax-H3 contract: its name does not follow "
            f"{MINIMAX_H3.contracts.turbo_grammar} and its metadata has no key_format='minimax-h3-native'. Use "
            f"LoadPEFTAdapter for other LoRAs.")
    chosen = contract.tasks[0] if task == "auto" else task
    contract = MINIMAX_H3.contracts.bound(contract, model.model.model_index, scale, chosen)
    handle = model.with_adapters(AdapterSpec(path, float(scale), component=contract.partition, name=lora_name),
                                 contracts=(contract,))
    words = [MINIMAX_H3.contracts.describe(contract)]
    if scale == 0:
        sigmas = contract.sigmas  # the artifact's own schedule, shown even though it is switched off
        words.append("scale 0: the adapter is off and its contract is not applied")
    else:
        request = SamplingRequest(steps=0, cfg=1.0, shift=0.0, task=chosen)
        resolved = MINIMAX_H3.contracts.resolve_schedule(handle, handle.contracts, request)
        sigmas = resolved.sigmas
        words += list(resolved.notes)
        words.append(f"{_task_words(task, contract.tasks, resolved.task)}; video sigmas "
                     f"{[round(s, 6) for s in resolved.sigmas]}; audio sigmas "
                     f"{[round(s, 6) for s in resolved.audio_sigmas]}")
    return CheckedContract(handle, ScheduleHandle(contract), tuple(sigmas), MINIMAX_H3.contracts.view(contract), words)


def _task_words(asked: str, served: tuple, resolved: str) -> str:
    """The task the run will be conditioned as. With "auto" on an artifact serving several tasks of one partition
    (a Turbo fl2v file: t2va and fl2va) the sampler takes it from the latent, which this node does not see: say
    that, rather than a task the run may not use (issue 44: "task=t2va" printed for a run conditioned as fl2va)."""
    if asked != "auto" or len(served) < 2:
        return f"task={resolved}"
    return (f"task from the latent: {' or '.join(served)} (the sampler conditions as fl2va when the latent is "
            f"anchored on a first frame, as ref2va when it carries reference images, else {resolved})")


def decode_audio(model, latent, *, where: str) -> dict:
    """The soundtrack of a sampled MiniMax-H3 latent as ComfyUI AUDIO."""
    if "audio" not in latent.extra:
        raise LoraBindError(f"{where}: the latent ({latent.family}) carries no MiniMax-H3 audio")
    return MINIMAX_H3.sampling.decode_audio(model.model, latent)


def with_first_frame(model, latent, image, *, where: str):
    """The latent anchored on a first frame (task fl2va)."""
    if not MINIMAX_H3.serves(model):
        raise LoraBindError(f"{where}: model {model.model.name} is {model.family}, not MiniMax-H3")
    return MINIMAX_H3.sampling.with_first_frame(model.model, latent, image)


def with_reference_images(model, latent, images, *, where: str):
    """The latent with reference images for task ref2va (at most ``MAX_REFERENCE_IMAGES``)."""
    if not MINIMAX_H3.serves(model):
        raise LoraBindError(f"{where}: model {model.model.name} is {model.family}, not MiniMax-H3")
    return MINIMAX_H3.sampling.with_references(model.model, latent, images)
