"""A step's latent as the picture a live preview shows: the first sample's first frame through a ``LatentRGB`` map
(``latent_rgb``), scaled to 0..255 as ComfyUI's latent2rgb previewer scales it."""

from __future__ import annotations

import numpy as np
import torch

from .latent_rgb import LatentRGB


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
