"""A latent as a small RGB picture, without the VAE: the live preview of a sampling step ("latent2rgb").

Why a linear map: a VAE's latent channels are close to a linear mix of the colours they decode to, so one matrix
(a row of red, green and blue weights per channel, plus a bias) gives a recognisable picture at the latent's own
resolution for a few thousand multiply-adds, where decoding would cost about as much as a step. The map is a fact
of one VAE's latent space, so each family declares the maps of the VAEs it uses (``FamilySampling``'s
``latent_rgb_maps``), together with the name ComfyUI gives the same latent space (``comfy.latent_formats``), so that
inside ComfyUI its own previewer (its TAESD-type decoder for that space, the user's ``--preview-method``) applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass(frozen=True)
class LatentRGB:
    """``factors``: one ``(r, g, b)`` row per latent channel; ``bias``: added to every pixel; ``comfy_format``: the
    class in ComfyUI's ``comfy.latent_formats`` that describes the same latent space (None: ComfyUI has none)."""

    factors: tuple
    bias: tuple = (0.0, 0.0, 0.0)
    comfy_format: Optional[str] = None

    @property
    def channels(self) -> int:
        return len(self.factors)


def spread_over_rgb(channels: int) -> LatentRGB:
    """A map for a latent space nobody has fitted (a tiny test model's VAE): channel ``c`` feeds colour ``c % 3``,
    scaled so that each colour averages its channels. Not a likeness, but the picture still moves as the step
    denoises, which is what a preview is watched for."""
    counts = [len(range(colour, channels, 3)) or 1 for colour in range(3)]
    rows = tuple(tuple(1.0 / counts[colour] if c % 3 == colour else 0.0 for colour in range(3))
                 for c in range(channels))
    return LatentRGB(factors=rows)


def latent_to_rgb(latent: torch.Tensor, rgb: LatentRGB) -> np.ndarray:
    """uint8 ``[H, W, 3]`` of the first sample (and, for a video latent ``[B, C, F, H, W]``, its first frame), as
    ComfyUI previews them: the linear map, then -1..1 scaled to 0..255.

    Why numpy: the product is a few hundred thousand multiply-adds, and torch hands even that to its thread pool,
    which on a busy machine costs tens of milliseconds of waiting (measured: 20-60 ms for a 104x60 latent on two
    loaded cores, 0.2 ms in numpy), on the thread of a sampler between two steps."""
    sample = (latent[0, :, 0] if latent.ndim == 5 else latent[0]).detach().float().cpu().numpy()
    channels, height, width = sample.shape
    weights = np.asarray(rgb.factors, dtype=np.float32).T  # [3, C]
    pixels = weights @ sample.reshape(channels, -1) + np.asarray(rgb.bias, dtype=np.float32)[:, None]
    pixels = np.clip((pixels + 1.0) * 127.5, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(pixels.reshape(3, height, width).transpose(1, 2, 0))
