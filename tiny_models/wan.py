"""Tiny Wan2.1 / Wan2.2 (two-expert MoE) text-to-video pipelines with random weights, built offline.

The shapes follow the real models' structure (UMT5 text encoder, WanTransformer3DModel, the Wan VAE with 16
latent channels and 4x temporal / 8x spatial compression) at a width that keeps each folder well under 1 MB, so
that every workflow and test runs on a CPU in seconds. Fixed seeds make the saved safetensors byte-identical
from build to build.
"""

from __future__ import annotations

from pathlib import Path

from ..loaders.families.wan.slots import LOW_NOISE_EXPERT  # the low-noise expert's component name
from ._common import diffusers_dir, save_pipeline_atomically, seeded
from .tokenizers import build_umt5_style_tokenizer

WAN22_NAME = "tiny-wan22-t2v"
WAN21_NAME = "tiny-wan21-t2v"
WAN22_BOUNDARY_RATIO = 0.875  # the real Wan2.2 T2V A14B value
TEXT_DIM = 32


def tiny_text_encoder(vocab_size: int):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=vocab_size, d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", dropout_rate=0.0,
    )
    return UMT5EncoderModel(config).eval()


def tiny_transformer(in_channels: int = 16, out_channels: int = 16, **image_branch):
    """The tiny denoiser; image-to-video variants widen ``in_channels`` and may add the CLIP image branch."""
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=in_channels,
        out_channels=out_channels, text_dim=TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32, **image_branch,
    )


def tiny_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True])


def unipc_scheduler():
    # What the real Wan-AI/*-Diffusers folders ship. Our sampler drives its own Euler loop over explicit sigmas,
    # but a normal folder keeps the pipeline usable with plain diffusers too.
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0,
                                   num_train_timesteps=1000)


def tiny_text_stack():
    """(tokenizer, UMT5 text encoder): the same in every tiny Wan model, so one prompt encodes alike in all."""
    tokenizer = build_umt5_style_tokenizer()
    with seeded(0):
        return tokenizer, tiny_text_encoder(len(tokenizer))


def assemble_wan_pipeline(pipeline_class, make_transformer, seeds: tuple, two_experts: bool):
    """A tiny Wan-style pipeline of ``pipeline_class``: the shared text stack and VAE, ``make_transformer()``
    seeded ``seeds[0]`` (high-noise ``transformer``) and, for an expert pair, again seeded ``seeds[1]`` (low-noise
    ``transformer_2``) at the published boundary."""
    tokenizer, text_encoder = tiny_text_stack()
    with seeded(1):
        vae = tiny_vae()
    with seeded(seeds[0]):
        transformer = make_transformer()
    experts = {}
    if two_experts:  # only then: WanPipeline before diffusers 0.35 takes neither argument
        with seeded(seeds[1]):
            experts = {LOW_NOISE_EXPERT: make_transformer(), "boundary_ratio": WAN22_BOUNDARY_RATIO}
    return pipeline_class(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=unipc_scheduler(),
                          transformer=transformer, **experts)


def build_wan_pipeline(two_experts: bool):
    """The in-memory pipeline: Wan2.2 MoE (``transformer`` high-noise, ``transformer_2`` low-noise) or Wan2.1."""
    from diffusers import WanPipeline

    return assemble_wan_pipeline(WanPipeline, tiny_transformer, (2, 3), two_experts)


def build_tiny_wan22(models_root) -> Path:
    return save_pipeline_atomically(build_wan_pipeline(two_experts=True), diffusers_dir(models_root) / WAN22_NAME)


def build_tiny_wan21(models_root) -> Path:
    return save_pipeline_atomically(build_wan_pipeline(two_experts=False), diffusers_dir(models_root) / WAN21_NAME)
