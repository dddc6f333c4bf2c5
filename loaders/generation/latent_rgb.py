"""The linear latent->RGB map of a VAE's latent space, what a live preview of a sampling step draws ("latent2rgb").

Why a linear map: a VAE's latent channels are close to a linear mix of the colours they decode to, so one matrix
(a row of red, green and blue weights per channel, plus a bias) gives a recognisable picture at the latent's own
resolution for a few thousand multiply-adds, where decoding would cost about as much as a step. The map is a fact
of one VAE's latent space, so each family declares the maps of the VAEs it uses (``FamilySampling``'s
``latent_rgb_maps``), together with the name ComfyUI gives the same latent space (``comfy.latent_formats``), so that
inside ComfyUI its own previewer (its TAESD-type decoder for that space, the user's ``--preview-method``) applies.
Data only, no imports: the families declare their maps at import, on ``lorabind plan``'s torch-free path too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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
