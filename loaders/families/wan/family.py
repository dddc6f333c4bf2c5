"""The Wan family (``FAMILY``): Wan2.1 (one transformer) and Wan2.2 MoE (``transformer`` = high-noise expert,
``transformer_2`` = low-noise expert, switching at ``boundary_ratio``), loaded as a diffusers ``WanPipeline``;
its contracts and sampling parts (the layout is ``layout``, the key map ``keymap``)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from ...handles import ConditioningHandle, LatentHandle
from ..diffusers_flow import (
    WAN21_VAE_RGB,
    DiffusersFlowSampling,
    OneScheduleContracts,
    check_multiple,
    text_device,
)
from ..interface import ModelFamily
from . import contracts, stages
from .image_conditioning import LATENT_KEY, VARIANT_NAMES, encode_image_condition, image_variant
from .keymap import KEYMAP
from .latent_rgb import WAN22_VAE_RGB
from .layout import WanLayout
from .prediction import BATCH_RULE, WanPrediction
from .single_files import assemble_wan_pipeline
from .slots import HIGH_NOISE_EXPERT
from .tensor_parallel import wan_tensor_parallel_plan
from .text_encoding import encode_real_tokens
from .vace_conditioning import VACE_KEY, check_vace_inputs, encode_vace_condition, is_vace, reference_count

# WanPipeline.__call__ pads UMT5 output to 512 tokens (Wan's text_len); its encode_prompt's own default is 226,
# which would change what the cross-attention sees, so we pass the __call__ value explicitly.
WAN_TEXT_TOKENS = 512
# Wan-AI/Wan2.2-{I2V,T2V}-A14B-Diffusers model_index.json boundary_ratio (reference §4.3)
DEFAULT_I2V_BOUNDARY = 0.9
DEFAULT_T2V_BOUNDARY = 0.875


class WanContracts(OneScheduleContracts):
    """Distill contracts by name, the Wan2.2 expert split, and which expert a stage may run."""

    declared_contract = staticmethod(contracts.declared_contract)
    check_resolved = staticmethod(contracts.check_expert_split)

    def check_artifact(self, model, file_name: str, component: str) -> None:
        super().check_artifact(model, file_name, component)
        contracts.check_artifact_fits(model, file_name, component, self.family.sampling.image_variant(model))

    def contract_to_dict(self, contract) -> dict:
        """The common view plus the contract's note (where published recipes disagree on a field)."""
        view = super().contract_to_dict(contract)
        note = dict(contract.extra).get("note")
        if note:
            view.update(note=note, text=f"{view['text']} ({note})")
        return view

    def check_stage(self, model_handle, schedule, enforce: bool) -> list:
        experts = self.family.sampling.experts_per_step(model_handle.model, schedule)
        roles = self.family.layout.denoiser_roles(model_handle.model)
        return stages.check_stage_experts(model_handle, schedule, experts, roles, enforce)


class WanSampling(DiffusersFlowSampling):
    """One schedule, switching from the high-noise to the low-noise expert at the boundary; start images (I2V,
    TI2V) and VACE control inputs travel in the latent."""

    latent_rgb_maps = (WAN21_VAE_RGB, WAN22_VAE_RGB)

    def assemble_single_files(self, source):
        return assemble_wan_pipeline(source, i2v_boundary=DEFAULT_I2V_BOUNDARY, t2v_boundary=DEFAULT_T2V_BOUNDARY)

    def tensor_parallel_plan(self, denoiser):
        """Wan's own plan (``tensor_parallel``): diffusers ships none, its q/k norm spans every head."""
        return wan_tensor_parallel_plan(denoiser)

    # Wan2.2 expert split
    def model_boundary(self, model) -> Optional[float]:
        """The checkpoint's own MoE boundary (``boundary_ratio``), None for single-expert models. A two-expert
        folder without one gets Wan2.2's published values: 0.9 for I2V A14B, 0.875 for T2V A14B."""
        if model.family != contracts.MOE_FAMILY:
            return None
        value = model.model_index.get("boundary_ratio")
        if value is None:
            return DEFAULT_I2V_BOUNDARY if self.image_variant(model) != "t2v" else DEFAULT_T2V_BOUNDARY
        return float(value)

    def effective_boundary(self, model, schedule) -> Optional[float]:
        """``schedule.boundary`` when set, else the model's ``boundary_ratio``; None when there is one expert."""
        if model.family != contracts.MOE_FAMILY:
            return None
        return float(schedule.boundary) if schedule.boundary is not None else self.model_boundary(model)

    def check_inputs(self, model, positive, negative, latent, schedule) -> None:
        self._check_image_condition(model, latent)
        self._check_control_condition(model, latent)
        super().check_inputs(model, positive, negative, latent, schedule)

    def run_warnings(self, model) -> list:
        """One Wan2.2 A14B expert run alone (one expert file, or an A14B folder without ``transformer_2``: both
        keep A14B's ``boundary_ratio``) samples every step on that expert: a bad video that looks like a model
        problem, so the sampler says why. Wan2.1 and TI2V-5B have no boundary and no warning."""
        boundary = model.model_index.get("boundary_ratio")
        if model.family == contracts.MOE_FAMILY or boundary is None or model.model_index.get("expand_timesteps"):
            return []
        expert = os.path.basename(model.path)  # the expert's file (a single-file set's first file) or folder
        return [f"{expert} is one of Wan2.2 A14B's two experts, run alone: every step runs on it, but the model "
                f"hands over from its high-noise to its low-noise expert at boundary {float(boundary):g}, so the "
                "video comes out wrong. Load both experts (the high-noise file as denoiser, the low-noise one as "
                "denoiser_low_noise) or the A14B folder with both"]

    def _check_control_condition(self, model, latent) -> None:
        """A VACE model needs a latent made with its control inputs (its forward takes them), and a latent made so
        fits no other model."""
        vace_model = is_vace(model.components[HIGH_NOISE_EXPERT].config)
        has_control = latent.extra.get(VACE_KEY) is not None
        if vace_model and not has_control:
            raise ValueError(f"latent: model {model.name!r} is a Wan VACE model; make the latent with "
                             "LoraBindVaceToVideo (a control video, masks or reference images, or none of them)")
        if has_control and not vace_model:
            raise ValueError(f"latent: it was made with VACE control inputs, but model {model.name!r} has no VACE "
                             "branch; make it with LoraBindEmptyLatent or LoraBindImageToVideo for this model")

    def _check_image_condition(self, model, latent) -> None:
        """An I2V model needs a latent made from a start image, a T2V model refuses one, and the conditioning must
        be the kind this model takes (TI2V, Wan2.1 I2V and Wan2.2 I2V each condition differently)."""
        variant = self.image_variant(model)
        image = latent.extra.get(LATENT_KEY)
        if image is None and variant in ("i2v", "i2v_clip"):
            raise ValueError(f"latent: model {model.name!r} is image-to-video ({VARIANT_NAMES[variant]}); make the "
                             "latent from a start image with LoraBindImageToVideo")
        if image is not None and image.variant != variant:
            raise ValueError(f"latent: it was made from a start image for a {VARIANT_NAMES[image.variant]} model, "
                             f"but model {model.name!r} is {VARIANT_NAMES[variant]}; make it with this model")

    def image_variant(self, model) -> str:
        """How the model takes a start image: "t2v", "i2v" (Wan2.2 I2V), "i2v_clip" (Wan2.1 I2V), "ti2v"."""
        return image_variant(model.components[HIGH_NOISE_EXPERT].config, model.model_index)

    # text, latents, prediction
    def encode_text(self, model, text: str) -> ConditioningHandle:
        """UMT5 over the prompt's real tokens, zero rows up to ``WAN_TEXT_TOKENS`` (``text_encoding``)."""
        embeds = encode_real_tokens(model.pipeline, text, WAN_TEXT_TOKENS, text_device(model))
        return ConditioningHandle(embeds=embeds.float().cpu(), family=model.family, text=text, mask=None)

    def latent_shape(self, model, width: int, height: int, frames: int, batch: int) -> tuple:
        vae = model.pipeline.vae.config
        # The Wan2.2 VAE (TI2V) compresses 16x (2x2 pixel patches, then 8x); diffusers >= 0.35 records the factor.
        spatial = getattr(vae, "scale_factor_spatial", None) or 2 ** len(vae.temperal_downsample)
        patch = model.components[HIGH_NOISE_EXPERT].config.patch_size
        check_multiple(width, height, spatial * patch[1], model)
        temporal = 2 ** sum(bool(d) for d in vae.temperal_downsample)
        if frames < 1 or (frames - 1) % temporal:
            raise ValueError(f"frames must be {temporal}·k + 1 for {model.name} (e.g. 1, {temporal + 1}, "
                             f"{2 * temporal + 1}), got {frames}")
        shape = (batch, vae.z_dim, (frames - 1) // temporal + 1, height // spatial, width // spatial)
        _check_positions(model, shape[2:], patch)
        return shape

    def empty_latent(self, model, width: int, height: int, frames: int = 1, batch: int = 1) -> LatentHandle:
        shape = self.latent_shape(model, width, height, frames, batch)
        return LatentHandle(samples=torch.zeros(shape), family=model.family, kind="video")

    def image_latent(self, model, start_image, end_image, width: int, height: int, frames: int,
                     batch: int = 1) -> LatentHandle:
        """The start latent of an image-to-video run: zeros (the sampler adds the seeded noise) carrying the
        start (and end) image's conditioning for every denoiser forward (``image_conditioning``)."""
        shape = self.latent_shape(model, width, height, frames, batch)
        condition = encode_image_condition(model, model.components[HIGH_NOISE_EXPERT].config, start_image,
                                           end_image, width, height, frames, shape)
        return LatentHandle(samples=torch.zeros(shape), family=model.family, kind="video",
                            extra={LATENT_KEY: condition})

    def control_latent(self, model, control_video, control_masks, reference_images, width: int, height: int,
                       frames: int, strength: float, batch: int = 1) -> LatentHandle:
        """The start latent of a VACE run: zeros with one extra latent frame per reference image, carrying the
        control conditioning for every denoiser forward (``vace_conditioning``)."""
        config = model.components[HIGH_NOISE_EXPERT].config
        check_vace_inputs(model.name, config, control_video, control_masks, reference_images)
        temporal = 2 ** sum(bool(d) for d in model.pipeline.vae.config.temperal_downsample)
        self.latent_shape(model, width, height, frames, batch)  # names a bad size before references widen it
        shape = self.latent_shape(model, width, height, frames + temporal * reference_count(reference_images), batch)
        condition = encode_vace_condition(model.pipeline, control_video, control_masks, reference_images, width,
                                          height, frames, strength, shape)
        return LatentHandle(samples=torch.zeros(shape), family=model.family, kind="video",
                            extra={VACE_KEY: condition})

    def decode(self, model, latent):
        """A VACE latent's reference-image frames are conditioning, not video: dropped before decoding."""
        control = latent.extra.get(VACE_KEY)
        if control is not None and control.reference_frames:
            latent = LatentHandle(samples=control.video_frames(latent.samples), family=latent.family,
                                  kind=latent.kind, extra=dict(latent.extra))
        return super().decode(model, latent)

    def prediction(self, model, positive, negative, latent) -> WanPrediction:
        return WanPrediction(self, model, positive, negative, latent)

    def batch_rule(self, model, component: str):
        return BATCH_RULE

    def from_model_space(self, x, latent):
        """TI2V: the encoded start image is the first latent frame of the result, exactly."""
        image = latent.extra.get(LATENT_KEY)
        return image.finish(x) if image is not None else x


def _check_positions(model, grid: tuple, patch) -> None:
    """The transformer's rotary table covers ``rope_max_seq_len`` positions per axis (1024 for the released
    models, 32 for the tiny ones); a larger latent would fail deep inside the attention with a reshape error."""
    limit = getattr(model.components[HIGH_NOISE_EXPERT].config, "rope_max_seq_len", None)
    if not limit:
        return
    for axis, size, step in zip(("frames", "height", "width"), grid, patch):
        if size // step > limit:
            raise ValueError(f"{model.name} places at most {limit} latent positions along {axis} (its "
                             f"rope_max_seq_len); this request needs {size // step}: lower the {axis}")


FAMILY = ModelFamily(id="wan", model_families=("wan2.1", contracts.MOE_FAMILY), layout=WanLayout(), keymap=KEYMAP,
                     contracts=WanContracts(), sampling=WanSampling(), runs_stages=True,
                     # Wan-AI/*-Diffusers scheduler_config.json: UniPCMultistepScheduler
                     reference_scheduler="unipc")
