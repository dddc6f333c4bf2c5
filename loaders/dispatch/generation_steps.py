"""The family-independent entry points of generation: encode a prompt, make an empty latent, check, denoise,
decode. Each asks the model's family (``loaders/families/<family>/``), which does the work through its own
pipeline modules; the nodes call these.

Why through the pipeline's ``encode_prompt``: the prompt template, padding and truncation rules (Qwen-Image drops
its 34-token system prefix, Wan pads UMT5 output to a fixed length) are part of what the denoiser was trained on;
re-implementing them would drift from diffusers. Latent geometry comes from the VAE config the same way.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..families import family_for, made_for
from ..generation.latent_rgb import LatentRGB
from ..handles import ConditioningHandle, LatentHandle


def encode_text(model, text: str) -> ConditioningHandle:
    """Encode one prompt with the model's own text encoder (embeds on the CPU in float32, batch 1)."""
    return family_for(model).sampling.encode_text(model, text)


def encode_with_images(model, text: str, images: list) -> tuple:
    """Encode one prompt together with input IMAGEs (image editing: Qwen-Image-Edit reads them in the prompt and
    appends their latents to every forward) -> (ConditioningHandle, lines saying how each image was resized);
    ValueError naming the input when the model takes no images or not that many."""
    family = family_for(model)
    conditioning = family.sampling.encode_with_images(model, text, images)
    notes = [line for reference in conditioning.extra.values() for line in getattr(reference, "notes", ())]
    return conditioning, notes + family.sampling.image_rules(model, images)


def latent_shape(model, width: int, height: int, frames: int, batch: int) -> tuple:
    """The family's latent shape for a width x height (x frames) output; raises ValueError naming the bad field."""
    return family_for(model).sampling.latent_shape(model, width, height, frames, batch)


def empty_latent(model, width: int, height: int, frames: int = 1, batch: int = 1) -> LatentHandle:
    """A zero latent of the family's shape: the sampler's start point for text-to-video / text-to-image."""
    return family_for(model).sampling.empty_latent(model, width, height, frames, batch)


def image_to_video_latent(model, start_image, end_image, width: int, height: int, frames: int,
                          batch: int = 1) -> LatentHandle:
    """The start latent of an image-to-video run: the family encodes the start (and optional end) IMAGE into
    the conditioning its denoiser needs; ValueError naming the input when the model cannot take it."""
    return family_for(model).sampling.image_latent(model, start_image, end_image, width, height, frames, batch)


def control_video_latent(model, control_video, control_masks, reference_images, width: int, height: int,
                         frames: int, strength: float = 1.0, batch: int = 1) -> LatentHandle:
    """The start latent of a controlled video run (Wan VACE): the family encodes the control video, masks and
    reference images into what its denoiser's control branch takes; ValueError naming the input it cannot take."""
    return family_for(model).sampling.control_latent(model, control_video, control_masks, reference_images, width,
                                                     height, frames, strength, batch)


def implied_task(model, latent: LatentHandle) -> Optional[str]:
    """The task a latent implies (MiniMax-H3: a latent anchored on a first frame means ``fl2va``), else None."""
    return family_for(model).sampling.implied_task(latent)


def check_inputs(model, positive: ConditioningHandle, negative: Optional[ConditioningHandle], latent: LatentHandle,
                 schedule) -> None:
    """Refuse inputs that cannot be sampled together, naming the input; cheap, so the sampler node calls it
    before binding (a refused run must not touch a weight). ``denoise`` calls it again for library callers."""
    for input_name, handle in (("positive", positive), ("negative", negative), ("latent", latent)):
        if handle is not None and not made_for(handle, model):
            raise ValueError(f"{input_name} was made for a {handle.family} model but the model {model.name!r} is "
                             f"{model.family}; encode the prompt / make the latent with this model")
    family_for(model).sampling.check_inputs(model, positive, negative, latent, schedule)


def denoise(model, positive: ConditioningHandle, negative: Optional[ConditioningHandle], latent: LatentHandle,
            schedule, seed: int, *, on_step: Optional[Callable[[int, int], None]] = None,
            on_latent: Optional[Callable] = None,
            check_interrupt: Optional[Callable[[], None]] = None) -> LatentHandle:
    """Sample from ``latent`` (start point; zeros for text-to-X) over the resolved ``schedule`` exactly.

    ``on_step(done, total)`` is called after each step, ``on_latent(done, total, denoised)`` just before it with
    the step's clean-latent estimate (a live preview's picture; not computed without it); ``check_interrupt()``
    before each step (it raises to stop). Returns a new ``LatentHandle``; the input is not modified."""
    check_inputs(model, positive, negative, latent, schedule)
    return family_for(model).sampling.denoise(model, positive, negative, latent, schedule, seed, on_step=on_step,
                                              on_latent=on_latent, check_interrupt=check_interrupt)


def latent_rgb(model, latent: LatentHandle) -> LatentRGB:
    """The linear latent->RGB map a live preview of ``latent`` uses: its family's for that many channels."""
    return family_for(model).sampling.latent_rgb(int(latent.samples.shape[1]))


def decode(model, latent: LatentHandle):
    """VAE-decode to ComfyUI's IMAGE: float [frames, H, W, C] in 0..1 (video batches are concatenated frames)."""
    return family_for(model).sampling.decode(model, latent)
