"""Denoising loops: flow-matching Euler over an explicit sigma list, Wan2.2 MoE expert switch, CFG; VAE decode.

Why our own loop instead of calling the diffusers pipelines: ``WanPipeline.__call__`` has no ``sigmas``
argument and every diffusers flow scheduler re-shifts custom sigmas and appends its own terminal 0
(``diffusers-feasibility.md`` §2), so a contract's exact schedule cannot pass through them unchanged. Here the
sigmas of a ``ResolvedSchedule`` are used verbatim: ``x_{i+1} = x_i + (σ_{i+1} − σ_i)·v(x_i, σ_i)`` with the
denoiser's timestep ``σ·1000``. The transformers, text encoders and VAEs are still the pipeline's own modules.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional, Sequence

import torch

from .handles import ConditioningHandle, LatentHandle
from .model_store import LoadedModel
from .placement import placement_of
from .sigmas import on_high_noise_expert

MOE_FAMILY = "wan2.2_moe"
HIGH_NOISE_EXPERT = "transformer"
LOW_NOISE_EXPERT = "transformer_2"


def model_boundary(model: LoadedModel) -> Optional[float]:
    """The checkpoint's own MoE boundary (``boundary_ratio`` in model_index.json), None for single-expert models."""
    value = model.model_index.get("boundary_ratio")
    return float(value) if value is not None and model.family == MOE_FAMILY else None


def effective_boundary(model: LoadedModel, schedule) -> Optional[float]:
    """``schedule.boundary`` when set, else the model's ``boundary_ratio``; None when there is one expert."""
    if model.family != MOE_FAMILY:
        return None
    return float(schedule.boundary) if schedule.boundary is not None else model_boundary(model)


def experts_per_step(model: LoadedModel, schedule) -> list[str]:
    """Which denoiser runs each step. Wan2.2: σ·1000 ≥ boundary·1000 on the high-noise expert, else low-noise."""
    sigmas = [float(s) for s in schedule.sigmas[:-1]]
    boundary = effective_boundary(model, schedule)
    if boundary is None:
        return [HIGH_NOISE_EXPERT] * len(sigmas)
    return [HIGH_NOISE_EXPERT if on_high_noise_expert(s, boundary) else LOW_NOISE_EXPERT for s in sigmas]


def guidance_for(cfg, expert: str) -> float:
    """Per-expert guidance: a pair means (high-noise, low-noise); a single value applies to every expert."""
    if isinstance(cfg, (tuple, list)):
        return float(cfg[0] if expert == HIGH_NOISE_EXPERT or len(cfg) == 1 else cfg[1])
    return float(cfg)


def initial_noise(shape: Sequence[int], seed: int) -> torch.Tensor:
    """Seeded standard normal noise, always drawn on the CPU in float32 so results do not depend on the device."""
    generator = torch.Generator("cpu").manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32)


def _batch(tensor: Optional[torch.Tensor], batch: int) -> Optional[torch.Tensor]:
    if tensor is None or tensor.shape[0] == batch:
        return tensor
    if tensor.shape[0] != 1:
        raise ValueError(f"conditioning batch {tensor.shape[0]} does not match latent batch {batch}")
    return tensor.expand(batch, *tensor.shape[1:])


def _device_and_dtype(module: torch.nn.Module):
    """The device and compute dtype. diffusers' ``module.dtype`` skips the parameters a model keeps in float32
    (Wan's ``scale_shift_table`` comes first): the first parameter alone would feed float32 into bf16 layers."""
    param = next(module.parameters())
    return param.device, getattr(module, "dtype", param.dtype)


class _WanVelocity:
    """v(x, σ) for Wan transformers: latents [B, 16, F, H, W], text embeds [B, seq, dim]."""

    def __init__(self, model: LoadedModel, positive: ConditioningHandle, negative: Optional[ConditioningHandle]):
        self.model = model
        self.positive = positive.embeds
        self.negative = negative.embeds if negative is not None else None
        self.expand_timesteps = bool(model.model_index.get("expand_timesteps", False))

    def __call__(self, expert: str, x: torch.Tensor, sigma: float, uncond: bool) -> torch.Tensor:
        transformer = self.model.components[expert]
        device, dtype = _device_and_dtype(transformer)
        batch = x.shape[0]
        embeds = _batch(self.negative if uncond else self.positive, batch).to(device, dtype)
        t = sigma * 1000.0
        if self.expand_timesteps:  # Wan2.2 TI2V: one timestep per latent token (all equal for text-to-video)
            _, _, frames, height, width = x.shape
            patch = transformer.config.patch_size
            tokens = (frames // patch[0]) * (height // patch[1]) * (width // patch[2])
            timestep = torch.full((batch, tokens), t, device=device, dtype=torch.float32)
        else:
            timestep = torch.full((batch,), t, device=device, dtype=torch.float32)
        out = transformer(hidden_states=x.to(device, dtype), timestep=timestep, encoder_hidden_states=embeds,
                          return_dict=False)[0]
        return out.float()


def pack_qwen_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, 1, H, W] -> [B, (H/2)(W/2), 4C]: Qwen-Image's 2x2 patch packing (as QwenImagePipeline does)."""
    batch, channels, _, height, width = latents.shape
    x = latents[:, :, 0].reshape(batch, channels, height // 2, 2, width // 2, 2)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack_qwen_latents(packed: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of ``pack_qwen_latents`` for a latent grid of ``height`` x ``width``."""
    batch, _, packed_channels = packed.shape
    channels = packed_channels // 4
    x = packed.reshape(batch, height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(batch, channels, 1, height, width)


class _QwenVelocity:
    """v(x, σ) for the Qwen-Image transformer on packed latents, with its norm-preserving "true CFG"."""

    def __init__(self, model, positive: ConditioningHandle, negative: Optional[ConditioningHandle], grid):
        self.transformer = model.components[HIGH_NOISE_EXPERT]
        self.positive = (positive.embeds, positive.mask)
        self.negative = (negative.embeds, negative.mask) if negative is not None else None
        self.grid = grid  # (latent height, latent width)
        # diffusers < 0.36 also wanted the text lengths; pass them only to transformers that take them.
        self.wants_txt_seq_lens = "txt_seq_lens" in inspect.signature(self.transformer.forward).parameters

    def __call__(self, expert: str, x: torch.Tensor, sigma: float, uncond: bool) -> torch.Tensor:
        device, dtype = _device_and_dtype(self.transformer)
        batch = x.shape[0]
        embeds, mask = self.negative if uncond else self.positive
        embeds = _batch(embeds, batch).to(device, dtype)
        mask = _batch(mask, batch).to(device) if mask is not None else None
        kwargs = {}
        if self.wants_txt_seq_lens:
            kwargs["txt_seq_lens"] = (mask.sum(dim=1).tolist() if mask is not None else [embeds.shape[1]] * batch)
        out = self.transformer(
            hidden_states=x.to(device, dtype), timestep=torch.full((batch,), sigma, device=device, dtype=dtype),
            encoder_hidden_states=embeds, encoder_hidden_states_mask=mask,
            img_shapes=[[(1, self.grid[0] // 2, self.grid[1] // 2)]] * batch, return_dict=False, **kwargs,
        )[0]
        return out.float()


def _guided(velocity, expert: str, x: torch.Tensor, sigma: float, cfg: float, renormalize: bool) -> torch.Tensor:
    """Classifier-free guidance; cfg == 1 is exactly one forward (the unconditional pass would cancel out)."""
    cond = velocity(expert, x, sigma, uncond=False)
    if cfg == 1.0:
        return cond
    uncond = velocity(expert, x, sigma, uncond=True)
    guided = uncond + cfg * (cond - uncond)
    if renormalize:  # Qwen-Image rescales the guided prediction to the conditional one's norm
        guided = guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))
    return guided


def implied_task(model, latent: LatentHandle) -> Optional[str]:
    """The task a latent implies (MiniMax-H3: a latent anchored on a first frame means ``fl2va``), else None."""
    if model.family == "minimax_h3":
        from . import minimax_h3_sampling

        return minimax_h3_sampling.implied_task(latent)
    return None


def check_inputs(model: LoadedModel, positive: ConditioningHandle, negative: Optional[ConditioningHandle],
                 latent: LatentHandle, schedule) -> None:
    """Refuse inputs that cannot be sampled together, naming the input; cheap, so the sampler node calls it
    before binding (a refused run must not touch a weight). ``denoise`` calls it again for library callers."""
    for input_name, handle in (("positive", positive), ("negative", negative), ("latent", latent)):
        if handle is not None and handle.family != model.family:
            raise ValueError(f"{input_name} was made for a {handle.family} model but the model {model.name!r} is "
                             f"{model.family}; encode the prompt / make the latent with this model")
    if model.family == "minimax_h3":
        from . import minimax_h3_sampling

        minimax_h3_sampling.check_inputs(model, positive, negative, latent, schedule)  # task, audio latents
        return
    if model.family == MOE_FAMILY and effective_boundary(model, schedule) is None:
        raise ValueError(f"model {model.name!r} has two experts but its model_index.json has no boundary_ratio; "
                         "set the sampler's boundary input (0.875 for T2V, 0.9 for I2V)")
    experts = experts_per_step(model, schedule)
    missing = sorted(set(experts) - set(model.components))
    if missing:
        raise ValueError(f"model {model.name!r} has no denoiser {missing} needed by the schedule")
    if negative is None and any(guidance_for(schedule.cfg, e) != 1.0 for e in experts):
        raise ValueError("cfg != 1 needs a negative conditioning")


def denoise(
    model: LoadedModel,
    positive: ConditioningHandle,
    negative: Optional[ConditioningHandle],
    latent: LatentHandle,
    schedule,
    seed: int,
    *,
    on_step: Optional[Callable[[int, int], None]] = None,
    check_interrupt: Optional[Callable[[], None]] = None,
) -> LatentHandle:
    """Sample from ``latent`` (start point; zeros for text-to-X) over ``schedule.sigmas`` exactly.

    The start is ``σ_0·noise + (1 − σ_0)·latent`` (the flow-matching interpolation). ``on_step(done, total)`` is
    called after each step with the number of steps done; ``check_interrupt()`` before each step (it raises to
    stop). Returns a new ``LatentHandle``; the input is not modified.
    """
    if model.family == "minimax_h3":
        from . import minimax_h3_sampling

        return minimax_h3_sampling.denoise(model, positive, negative, latent, schedule, seed,
                                           on_step=on_step, check_interrupt=check_interrupt)
    check_inputs(model, positive, negative, latent, schedule)
    sigmas = [float(s) for s in schedule.sigmas]
    experts = experts_per_step(model, schedule)

    samples = latent.samples.float()
    noise = initial_noise(samples.shape, seed)
    x = sigmas[0] * noise + (1.0 - sigmas[0]) * samples
    if model.family == "qwen_image":
        grid = tuple(samples.shape[-2:])
        velocity = _QwenVelocity(model, positive, negative, grid)
        x = pack_qwen_latents(x)
    else:
        velocity = _WanVelocity(model, positive, negative)

    total = len(experts)
    placement = placement_of(model)
    with torch.no_grad():
        for i, expert in enumerate(experts):
            if check_interrupt is not None:
                check_interrupt()
            if placement is not None:  # the memory plan brings this expert to the device (a swap at the boundary)
                placement.activate(expert)
            v = _guided(velocity, expert, x, sigmas[i], guidance_for(schedule.cfg, expert),
                        renormalize=model.family == "qwen_image")
            x = x + (sigmas[i + 1] - sigmas[i]) * v.to(x.device)
            if on_step is not None:
                on_step(i + 1, total)
    if placement is not None:
        placement.end_denoise()

    if model.family == "qwen_image":
        x = unpack_qwen_latents(x, *grid)
    return LatentHandle(samples=x.cpu(), family=latent.family, kind=latent.kind, extra=dict(latent.extra))


def decode(model: LoadedModel, latent: LatentHandle) -> torch.Tensor:
    """VAE-decode to ComfyUI's IMAGE: float [frames, H, W, C] in 0..1 (video batches are concatenated frames).

    The latents are de-normalised with the VAE's ``latents_mean``/``latents_std`` exactly as the pipelines do.
    """
    if model.family == "minimax_h3":
        from . import minimax_h3_sampling

        return minimax_h3_sampling.decode(model, latent)
    vae = model.pipeline.vae
    placement = placement_of(model)
    if placement is not None:
        from .memory import default_decode_bytes

        scale = 2 ** len(vae.config.temperal_downsample)  # latent -> pixel factor of the Wan/Qwen VAEs
        placement.prepare_decode(default_decode_bytes(latent.samples.shape[-1] * scale,
                                                      latent.samples.shape[-2] * scale))
    device, dtype = _device_and_dtype(vae)
    z = latent.samples.to(device, dtype)
    channels = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean, device=device, dtype=dtype).view(1, channels, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=device, dtype=dtype).view(1, channels, 1, 1, 1)
    with torch.no_grad():
        video = vae.decode(z * std + mean, return_dict=False)[0]  # [B, 3, F, H, W] in -1..1
    frames = video.float().permute(0, 2, 3, 4, 1).reshape(-1, video.shape[3], video.shape[4], video.shape[1])
    return (frames / 2 + 0.5).clamp(0.0, 1.0).cpu()
