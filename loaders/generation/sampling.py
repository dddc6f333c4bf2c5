"""The sampling maths every family shares: seeded noise, flow-matching Euler over explicit sigmas, CFG, and the
expert split at a boundary. What a step *predicts* is the family's (``loaders/families/<family>/``).

Why our own loop instead of calling the diffusers pipelines: ``WanPipeline.__call__`` has no ``sigmas``
argument and every diffusers flow scheduler re-shifts custom sigmas and appends its own terminal 0
(``diffusers-feasibility.md`` §2), so a contract's exact schedule cannot pass through them unchanged. Here the
sigmas of a ``ResolvedSchedule`` are used verbatim: ``x_{i+1} = x_i + (σ_{i+1} − σ_i)·v(x_i, σ_i)``. The
transformers, text encoders and VAEs are still the pipeline's own modules.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..contracts.sigmas import on_high_noise_expert
from ..distributed.cfg_parallel import guidance_passes


def initial_noise(shape: Sequence[int], seed: int) -> torch.Tensor:
    """Seeded standard normal noise, always drawn on the CPU in float32 so results do not depend on the device."""
    generator = torch.Generator("cpu").manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32)


def noised_start(samples: torch.Tensor, seed: int, sigma: float) -> torch.Tensor:
    """The flow-matching start point ``σ_0·noise + (1 − σ_0)·latent`` (zeros latent: pure scaled noise)."""
    noise = initial_noise(samples.shape, seed)
    return sigma * noise + (1.0 - sigma) * samples


def split_at_boundary(sigmas: Sequence[float], boundary: Optional[float], high: str, low: str) -> list:
    """Which denoiser runs each step: σ·1000 ≥ boundary·1000 on ``high``, else ``low``; all ``high`` when the
    boundary is None (one expert)."""
    steps = [float(s) for s in sigmas[:-1]]
    if boundary is None:
        return [high] * len(steps)
    return [high if on_high_noise_expert(s, boundary) else low for s in steps]


def guidance_for(cfg, low_noise: bool) -> float:
    """Per-expert guidance: a pair means (high-noise, low-noise); a single value applies to every expert."""
    if isinstance(cfg, (tuple, list)):
        return float(cfg[1] if low_noise and len(cfg) > 1 else cfg[0])
    return float(cfg)


def guided(predict: Callable, expert: str, x: torch.Tensor, sigma: float, cfg: float,
           renormalize: Optional[Callable] = None) -> torch.Tensor:
    """Classifier-free guidance; cfg == 1 is exactly one forward (the unconditional pass would cancel out).
    ``renormalize(guided, cond)`` lets a family rescale the guided prediction (Qwen-Image). Under ``--parallel
    cfg=2`` the two passes run on two ranks (``distributed.cfg_parallel``)."""
    if cfg == 1.0:
        return predict(expert, x, sigma, uncond=False)
    cond, uncond = guidance_passes(lambda index: predict(expert, x, sigma, uncond=index == 1), 2)
    result = uncond + cfg * (cond - uncond)
    return renormalize(result, cond) if renormalize is not None else result


LatentCallback = Callable[[int, int, torch.Tensor], None]
"""``on_latent(done, total, denoised)``: after a step, before ``on_step``, the clean latent that step predicts
(what a live preview shows, as ComfyUI's samplers hand their callback ``x0``)."""


def denoised(x: torch.Tensor, sigma: float, velocity: torch.Tensor) -> torch.Tensor:
    """The flow-matching estimate of the clean latent from ``x`` at ``sigma``: ``x − σ·v`` (Euler to σ = 0)."""
    return x - sigma * velocity


def euler(x: torch.Tensor, sigmas: Sequence[float], velocity: Callable[[int, torch.Tensor, float], torch.Tensor], *,
          on_step: Optional[Callable[[int, int], None]] = None, on_latent: Optional[LatentCallback] = None,
          check_interrupt: Optional[Callable[[], None]] = None) -> torch.Tensor:
    """Flow-matching Euler over the explicit ``sigmas``: ``x += (σ_{i+1} − σ_i)·velocity(i, x, σ_i)``.

    ``on_step(done, total)`` is called after each step (``on_latent`` first, when given: nothing is computed for
    it otherwise); ``check_interrupt()`` before each (it raises to stop)."""
    total = len(sigmas) - 1
    with torch.no_grad():
        for i in range(total):
            if check_interrupt is not None:
                check_interrupt()
            v = velocity(i, x, sigmas[i]).to(x.device)
            if on_latent is not None:
                on_latent(i + 1, total, denoised(x, sigmas[i], v))
            x = x + (sigmas[i + 1] - sigmas[i]) * v
            if on_step is not None:
                on_step(i + 1, total)
    return x


def batched(tensor: Optional[torch.Tensor], batch: int) -> Optional[torch.Tensor]:
    """A batch-1 conditioning tensor expanded to the latent batch (a different batch is an error)."""
    if tensor is None or tensor.shape[0] == batch:
        return tensor
    if tensor.shape[0] != 1:
        raise ValueError(f"conditioning batch {tensor.shape[0]} does not match latent batch {batch}")
    return tensor.expand(batch, *tensor.shape[1:])


def device_and_dtype(module: torch.nn.Module):
    """Where a module's weights live and its compute dtype (inputs are moved there before a forward).
    diffusers' ``module.dtype`` skips the parameters a model keeps in float32 (Wan's ``scale_shift_table`` comes
    first): the first parameter alone would feed float32 into bf16 layers. Weights a memory plan keeps in their
    file are meta tensors until the module's forward brings them: inputs are then prepared on the CPU and the
    placement's hook moves them where the weights come up."""
    param = next(module.parameters())
    device = torch.device("cpu") if param.is_meta else param.device
    return device, getattr(module, "dtype", param.dtype)
