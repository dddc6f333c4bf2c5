"""What the Wan and Qwen-Image families share: a ``DiffusionPipeline`` folder, one sigma schedule, flow-matching
Euler with CFG, and a video VAE with ``latents_mean``/``latents_std``.

``DiffusersFlowSampling`` implements that sampling once; a subclass supplies its ``prediction`` (the forward one
sampling step calls) and, where it has one, its own latent packing and CFG rescaling. ``OneScheduleContracts``
resolves a request on the one schedule, with a family's own check of the result (``check_resolved``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Optional

from ..contract_types import ResolvedSchedule
from ..contracts.schedule_rules import resolve_single_schedule
from ..contracts.sigmas import TABLE_TOLERANCE
from ..errors import ContractError
from ..generation.forward_route import denoise_ended
from ..generation.latent_rgb import LatentRGB
from ..generation.sampling import device_and_dtype, guidance_for, guided, noised_start, split_at_boundary
from ..generation.schedulers import step_over
from ..handles import LatentHandle, ModelHandle
from .interface import SOURCE_DIFFUSERS, SOURCE_SINGLE_FILE, PipelineSource
from .parts import FamilyContracts, FamilySampling
from .roles import ROLE_DENOISER, ROLE_HIGH_NOISE, ROLE_LOW_NOISE


def pipeline_class(source: PipelineSource):
    """The class that loads a diffusers folder: ``DiffusionPipeline`` (which finds the folder's own), or, when
    the source brings modules already built (``source.components``), the folder's class itself.

    Why: diffusers reads which components are optional (``_optional_components``: Wan's ``transformer``) off the
    class ``from_pretrained`` is called on, and ``DiffusionPipeline`` lists none, so a Wan transformer passed to
    it is taken for a plain argument and loaded from the folder again, the passed one dropped."""
    import diffusers

    if not source.components:
        return diffusers.DiffusionPipeline
    name = source.model_index.get("_class_name")
    found = getattr(diffusers, name, None) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"{source.path}: model_index.json names no pipeline class this diffusers has ({name!r})")
    return found


def dtype_kwargs(dtype) -> dict:
    """diffusers >= 0.36 takes ``dtype=`` (and warns on ``torch_dtype=``); older releases only ``torch_dtype=``."""
    if dtype is None:
        return {}
    from diffusers.pipelines import pipeline_utils

    # Feature probe: the helper that accepts the new keyword exists only in releases that support it.
    return {"dtype": dtype} if hasattr(pipeline_utils, "_resolve_dtype") else {"torch_dtype": dtype}


def check_multiple(width: int, height: int, multiple: int, model) -> None:
    for field_name, value in (("width", width), ("height", height)):
        if value < multiple or value % multiple:
            raise ValueError(f"{field_name} must be a positive multiple of {multiple} for {model.name}, got {value}")


def text_device(model):
    return device_and_dtype(model.pipeline.text_encoder)[0]


# LatentHandle.extra key: the sigma a stage stopped at, when it left noise for the next sampler (absent: clean)
NOISE_SIGMA = "lorabind_noise_sigma"


def check_continuation(latent, schedule) -> None:
    """A stage with add_noise off continues a latent: it must start at the sigma the previous stage stopped at
    (a clean latent, or a noisy one with add_noise on, would be sampled as if it held other noise)."""
    left = latent.extra.get(NOISE_SIGMA)
    first = float(schedule.stage_sigmas()[0])
    if schedule.add_noise and left is not None:
        raise ValueError(f"the latent still holds noise at sigma {left:.4f} (a stage that stopped early): turn "
                         f"add_noise off to continue it, or start from a clean latent")
    if not schedule.add_noise and left is not None and abs(left - first) > TABLE_TOLERANCE:
        raise ValueError(f"add_noise is off, so this stage continues the latent, which the previous stage left at "
                         f"sigma {left:.4f}; this stage starts at sigma {first:.4f} (step {schedule.start_step}): "
                         f"set start_step to where the previous stage's end_step stopped")


class OneScheduleContracts(FamilyContracts):
    """Contracts of a family sampled on one sigma schedule (``schedule_rules.resolve_single_schedule``)."""

    def resolve_schedule(self, model_handle, contracts: tuple, request) -> ResolvedSchedule:
        return resolve_single_schedule(model_handle, contracts, request, serves=self.family.model_families,
                                       check_resolved=self.check_resolved)

    def check_resolved(self, model_handle, resolved: ResolvedSchedule, request, overrides: list) -> None:
        """A family's own check of a resolved schedule (may raise ContractError or append to ``overrides``)."""

    def refusal_before_loading(self, model_name: str, model_index: dict, contracts: tuple, request):
        """The one-schedule resolution reads only the model's name, family and ``model_index.json`` (the Wan2.2
        expert split: its boundary_ratio), so it runs on a stand-in of the model before anything loads."""
        model = SimpleNamespace(name=model_name, family=self.family.layout.detect(model_index),
                                model_index=model_index)
        try:
            self.resolve_schedule(ModelHandle(model=model), contracts, request)
        except ContractError as exc:
            return str(exc)
        except ValueError:  # a value no schedule takes: the sampler's own check names it when it runs
            return None
        return None


# The latent->RGB map of the Wan2.1 VAE's normalised latent space (16 channels), which Wan (A14B, 1.3B) and
# Qwen-Image (the same VAE architecture and latent statistics) share: the linear fit ComfyUI publishes for that
# space as ``comfy.latent_formats.Wan21`` (ComfyUI previews Qwen-Image with it too), a fact of the VAE.
WAN21_VAE_RGB = LatentRGB(
    factors=(
        (-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747), (0.0372, 0.2344, 0.142),
        (0.0313, 0.0189, -0.0328), (0.0296, -0.0956, -0.0665), (-0.3477, -0.4059, -0.2925), (0.0166, 0.1902, 0.1975),
        (-0.0412, 0.0267, -0.1364), (-0.1293, 0.074, 0.1636), (0.068, 0.3019, 0.1128), (0.0032, 0.0581, 0.0639),
        (-0.1251, 0.0927, 0.1699), (0.006, -0.0633, 0.0005), (0.3477, 0.2275, 0.295), (0.1984, 0.0913, 0.1861),
    ),
    bias=(-0.1835, -0.0868, -0.336),
    comfy_format="Wan21",
)


class DiffusersFlowSampling(FamilySampling):
    """Shared sampling for families loaded as a ``DiffusionPipeline`` and sampled on one schedule."""

    latent_rgb_maps = (WAN21_VAE_RGB,)

    def load_pipeline(self, source: PipelineSource):
        if source.kind == SOURCE_SINGLE_FILE:
            return self.assemble_single_files(source)
        if source.kind != SOURCE_DIFFUSERS:
            raise ValueError(f"{source.path}: cannot load a {source.kind!r} source for {self.family.id} models")
        return pipeline_class(source).from_pretrained(source.path, local_files_only=True, use_safetensors=True,
                                                      **dtype_kwargs(source.dtype), **source.components)

    def assemble_single_files(self, source: PipelineSource):
        """The family's pipeline from modules built out of single files (``PipelineSource`` kind "single_file")."""
        raise ValueError(f"{source.path}: {self.family.id} models do not load from single files")

    def experts_per_step(self, model, schedule) -> list:
        roles = self.family.layout.denoiser_roles(model)
        high = next((n for n, r in roles.items() if r in (ROLE_HIGH_NOISE, ROLE_DENOISER)), "transformer")
        low = next((n for n, r in roles.items() if r == ROLE_LOW_NOISE), high)
        return split_at_boundary(schedule.sigmas, self.effective_boundary(model, schedule), high, low)

    def _is_low_noise(self, model, expert: str) -> bool:
        return self.family.layout.denoiser_roles(model).get(expert) == ROLE_LOW_NOISE

    def check_inputs(self, model, positive, negative, latent, schedule) -> None:
        experts = self.experts_per_step(model, schedule)
        missing = sorted(set(experts) - set(model.components))
        if missing:
            raise ValueError(f"model {model.name!r} has no denoiser {missing} needed by the schedule")
        if negative is None and any(guidance_for(schedule.cfg, self._is_low_noise(model, e)) != 1.0
                                    for e in experts):
            raise ValueError("cfg != 1 needs a negative conditioning")
        check_continuation(latent, schedule)

    # hooks for the subclasses ------------------------------------------------------------------------------------

    def prediction(self, model, positive, negative, latent) -> Callable:
        """``predict(expert, x, sigma, uncond) -> velocity`` in the model's latent space (float32)."""
        raise NotImplementedError

    def to_model_space(self, x, latent):
        """The sampled tensor as the denoiser takes it (Qwen-Image packs 2x2 patches); identity by default."""
        return x

    def from_model_space(self, x, latent):
        return x

    renormalize: Optional[Callable] = None  # rescales a CFG-guided prediction (Qwen-Image's "true CFG")

    # ---------------------------------------------------------------------------------------------------------

    def denoise(self, model, positive, negative, latent, schedule, seed: int, *, on_step=None, on_latent=None,
                check_interrupt=None) -> LatentHandle:
        """Sample the stage ``schedule.stage_sigmas()`` exactly with ``schedule.scheduler``: the start is
        ``σ_0·noise + (1 − σ_0)·latent`` (zeros for text-to-X), or the latent itself when add_noise is off (it
        continues a stage); each step runs the expert ``experts_per_step`` names for its place in the schedule.
        A stage that stops above σ = 0 returns the noise state, marked for the next sampler."""
        self.check_inputs(model, positive, negative, latent, schedule)
        sigmas = [float(s) for s in schedule.stage_sigmas()]
        experts = self.experts_per_step(model, schedule)[schedule.start_step:]
        predict = self.prediction(model, positive, negative, latent)
        start = noised_start(latent.samples.float(), seed, sigmas[0]) if schedule.add_noise else latent.samples.float()
        x = self.to_model_space(start, latent)

        def velocity(i, x, sigma):  # the forward brings the expert to the device (a swap at the boundary)
            cfg = guidance_for(schedule.cfg, self._is_low_noise(model, experts[i]))
            return guided(predict, experts[i], x, sigma, cfg, self.renormalize)

        def in_latent_space(done, total, estimate):  # a preview sees the latent as the sampler outputs it
            on_latent(done, total, self.from_model_space(estimate, latent))

        scheduler_config = getattr(getattr(model.pipeline, "scheduler", None), "config", None)
        x = step_over(x, sigmas, velocity, schedule.scheduler, config=scheduler_config, on_step=on_step,
                      on_latent=in_latent_space if on_latent is not None else None, check_interrupt=check_interrupt)
        denoise_ended(model)
        x = self.from_model_space(x, latent)
        extra = {key: value for key, value in latent.extra.items() if key != NOISE_SIGMA}
        if sigmas[-1] > 0.0:
            extra[NOISE_SIGMA] = sigmas[-1]
        return LatentHandle(samples=x.cpu(), family=latent.family, kind=latent.kind, extra=extra)

    def decode(self, model, latent):
        """VAE-decode to ComfyUI's IMAGE: float [frames, H, W, C] in 0..1 (video batches are concatenated
        frames); the latents are de-normalised with the VAE's ``latents_mean``/``latents_std`` as the
        pipelines do."""
        import torch

        vae = model.pipeline.vae
        placement = _placement_of(model)
        if placement is not None:
            scale = 2 ** len(vae.config.temperal_downsample)  # latent -> pixel factor of the Wan/Qwen VAEs
            placement.prepare_image_decode(latent.samples.shape[-1] * scale, latent.samples.shape[-2] * scale)
        device, dtype = device_and_dtype(vae)
        z = latent.samples.to(device, dtype)
        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=device, dtype=dtype).view(1, channels, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=device, dtype=dtype).view(1, channels, 1, 1, 1)
        with torch.no_grad():
            video = vae.decode(z * std + mean, return_dict=False)[0]  # [B, 3, F, H, W] in -1..1
        frames = video.float().permute(0, 2, 3, 4, 1).reshape(-1, video.shape[3], video.shape[4], video.shape[1])
        return (frames / 2 + 0.5).clamp(0.0, 1.0).cpu()


def _placement_of(model):
    """The ``ModelPlacement`` the model was loaded under (``loaders.placement.apply_plan``), or None for models
    loaded without one (tools that never sample). Read as an attribute: the families sit below placement in the
    engine's layering, so they use what the loader attached without importing it."""
    return getattr(model, "placement", None)
