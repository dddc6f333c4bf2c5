"""Tiny Wan image-to-video pipelines (Wan2.2 I2V A14B, Wan2.1 I2V, Wan2.2 TI2V-5B), random weights, built offline.

The three variants condition on the start image in three different ways (diffusers ``pipeline_wan_i2v.py``),
so each tiny model keeps exactly the structure that decides how:

- ``tiny-wan22-i2v``: two experts, no image encoder; the VAE-encoded image and a 4-channel frame mask are
  concatenated to the 16-channel noise latent, so ``in_channels`` is 36; ``boundary_ratio`` 0.9 as in the real
  ``Wan-AI/Wan2.2-I2V-A14B-Diffusers``.
- ``tiny-wan21-i2v``: the same 36-channel concatenation plus a CLIP vision ``image_encoder`` whose penultimate
  hidden states feed the transformer's image branch (``image_dim``, ``add_k_proj``/``add_v_proj``,
  ``norm_added_k``); the CLIP image processor is built locally from a config (no download).
- ``tiny-wan22-ti2v``: the Wan2.2 VAE (48 latent channels, 2x2 patchified pixels, 16x spatial compression) and
  ``expand_timesteps``: the first latent frame *is* the encoded image, kept fixed, with per-token timesteps.
  The real folder is a ``WanPipeline`` (it also does text-to-video); diffusers 0.42 runs its image-to-video
  through ``WanImageToVideoPipeline.from_pretrained`` of the same folder, which reads ``expand_timesteps``.
"""

from __future__ import annotations

from pathlib import Path

from ..loaders.families.wan.image_conditioning import clip_image_processor
from ..loaders.families.wan.slots import LOW_NOISE_EXPERT  # the low-noise expert's component name
from ._common import diffusers_dir, save_pipeline_atomically, seeded
from .wan import tiny_text_stack, tiny_transformer, tiny_vae, unipc_scheduler

WAN22_I2V_NAME = "tiny-wan22-i2v"
WAN21_I2V_NAME = "tiny-wan21-i2v"
WAN22_TI2V_NAME = "tiny-wan22-ti2v"
WAN22_I2V_BOUNDARY_RATIO = 0.9  # the real Wan2.2 I2V A14B value (T2V uses 0.875)

LATENT_CHANNELS = 16
MASK_CHANNELS = 4  # one mask channel per frame of the VAE's 4x temporal compression
I2V_IN_CHANNELS = 2 * LATENT_CHANNELS + MASK_CHANNELS  # noise + encoded image + mask = 36
TI2V_LATENT_CHANNELS = 48

CLIP_IMAGE_SIZE = 32
CLIP_PATCH = 8
CLIP_HIDDEN = 16  # = the transformer's image_dim


def _wan22_vae():
    """The Wan2.2 VAE's structure (residual blocks, 12 = 3x2x2 patchified input channels, 48 latent channels,
    16x spatial compression) at a tiny width. Latent statistics are fixed, non-trivial values so that a wrong
    (de)normalisation shows up in tests."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=TI2V_LATENT_CHANNELS, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
        scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=[round(-0.5 + i / 47, 4) for i in range(TI2V_LATENT_CHANNELS)],
        latents_std=[round(0.5 + (i % 7) / 6, 4) for i in range(TI2V_LATENT_CHANNELS)],
    )


def _clip_vision():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(hidden_size=CLIP_HIDDEN, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, image_size=CLIP_IMAGE_SIZE, patch_size=CLIP_PATCH,
                              projection_dim=CLIP_HIDDEN)
    return CLIPVisionModel(config).eval()


def _i2v_pipeline(two_experts: bool, image_encoder: bool):
    from diffusers import WanImageToVideoPipeline


    tokenizer, text_encoder = tiny_text_stack()
    with seeded(1):
        vae = tiny_vae()
    parts = {}
    branch = {}
    if image_encoder:
        with seeded(4):
            parts = {"image_encoder": _clip_vision(), "image_processor": clip_image_processor(CLIP_IMAGE_SIZE)}
        branch = {"image_dim": CLIP_HIDDEN, "added_kv_proj_dim": 24}  # added_kv_proj_dim = inner dim, as in 14B
    with seeded(2):
        parts["transformer"] = tiny_transformer(I2V_IN_CHANNELS, LATENT_CHANNELS, **branch)
    if two_experts:
        with seeded(3):
            parts[LOW_NOISE_EXPERT] = tiny_transformer(I2V_IN_CHANNELS, LATENT_CHANNELS, **branch)
        parts["boundary_ratio"] = WAN22_I2V_BOUNDARY_RATIO
    return WanImageToVideoPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                                   scheduler=unipc_scheduler(), **parts)


def build_ti2v_pipeline():
    """Wan2.2 TI2V-5B in small: one transformer on 48-channel latents, ``expand_timesteps``."""
    from diffusers import WanPipeline

    tokenizer, text_encoder = tiny_text_stack()
    with seeded(5):
        vae = _wan22_vae()
    with seeded(6):
        transformer = tiny_transformer(TI2V_LATENT_CHANNELS, TI2V_LATENT_CHANNELS)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=unipc_scheduler(),
                       transformer=transformer, expand_timesteps=True)


def build_tiny_wan22_i2v(models_root) -> Path:
    pipeline = _i2v_pipeline(two_experts=True, image_encoder=False)
    return save_pipeline_atomically(pipeline, diffusers_dir(models_root) / WAN22_I2V_NAME)


def build_tiny_wan21_i2v(models_root) -> Path:
    pipeline = _i2v_pipeline(two_experts=False, image_encoder=True)
    return save_pipeline_atomically(pipeline, diffusers_dir(models_root) / WAN21_I2V_NAME)


def build_tiny_wan22_ti2v(models_root) -> Path:
    return save_pipeline_atomically(build_ti2v_pipeline(), diffusers_dir(models_root) / WAN22_TI2V_NAME)
