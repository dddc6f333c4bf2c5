"""Live previews of a sampler's steps where ComfyUI's own previewer is not there (``serve``, ``run``): each step's
clean-latent estimate through the family's latent->RGB map, first frame, fitted into ``max_size``, as a JPEG.

Why here: the rule is the same for every headless host (ComfyUI's ``--preview-method`` names, its fallback from
``taesd`` to latent2rgb when no decoder is there, previews fitted into ``--preview-size`` as ComfyUI fits them),
and it is cheap by design: nothing at all without a method, then one matrix product over the first frame's latent
pixels and one JPEG of at most ``max_size`` pixels a side per step (about 2 ms at 512 on one CPU core, whatever
the model), skipped when the last preview went out less than ``interval_s`` ago (the last step always goes out),
on the request's own thread, so each preview belongs to the prompt that asked for it.
"""

from __future__ import annotations

import io
import logging
import time
from typing import Callable, Optional

from PIL import Image, ImageOps

from ..loaders.dispatch import generation_steps as generation
from ..loaders.generation.latent_preview import latent_to_rgb
from ..loaders.generation.latent_rgb import LatentRGB

log = logging.getLogger("lorabind.previews")

# ComfyUI's --preview-method choices; "auto" is latent2rgb (ComfyUI's rule when no method is named)
PREVIEW_METHODS = ("none", "auto", "latent2rgb", "taesd")
JPEG_QUALITY = 95  # what ComfyUI encodes its previews with
_warned_taesd = False


def preview_map(model, latent) -> LatentRGB:
    """The latent->RGB map of ``latent`` on ``model`` (a model handle): its family's for that many channels."""
    return generation.latent_rgb(model.model, latent)


class StepPreviewer:
    """``previewer(done, total, denoised)`` -> JPEG bytes of that step's picture, or None when the interval since
    the last one has not passed (``clock`` is injectable for the tests)."""

    def __init__(self, rgb: LatentRGB, max_size: int, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.rgb, self.max_size, self.interval_s, self.clock = rgb, int(max_size), float(interval_s), clock
        self._last: Optional[float] = None

    def __call__(self, done: int, total: int, denoised) -> Optional[bytes]:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s and done < total:
            return None
        self._last = now
        # fitted into the preview size either way, as ComfyUI sends its previews: the frontend never enlarges a
        # picture, so a latent of a few dozen pixels would show as a dot on the node
        image = ImageOps.contain(Image.fromarray(latent_to_rgb(denoised, self.rgb)),
                                 (self.max_size, self.max_size), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        # full-resolution colour (no 4:2:0 subsampling): a preview is often a few latent pixels across
        image.save(buffer, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
        return buffer.getvalue()


def step_previewer(model, latent, method: str, max_size: int, interval_s: float) -> Optional[StepPreviewer]:
    """The previewer of one sampler run for ``method`` (one of ``PREVIEW_METHODS``), or None for "none": then the
    sampler computes nothing for previews. ``taesd`` falls back to latent2rgb, as ComfyUI does when it finds no
    decoder: the TAESD-type decoders are ComfyUI's (``models/vae_approx``), and only its previewer runs them."""
    if method not in PREVIEW_METHODS:
        raise ValueError(f"preview method must be one of {list(PREVIEW_METHODS)}, got {method!r}")
    if method == "none":
        return None
    if method == "taesd":
        _warn_taesd_once()
    return StepPreviewer(preview_map(model, latent), max_size, interval_s)


def _warn_taesd_once() -> None:
    global _warned_taesd
    if not _warned_taesd:
        _warned_taesd = True
        log.warning("preview method taesd: the TAESD-type decoders run inside ComfyUI only; lorabind serve/run "
                    "preview with latent2rgb")
