"""Tiny Qwen-Image text-to-image pipeline with random weights, built offline.

Structure of the real model (Qwen2.5-VL text encoder read through the prompt template, MMDiT transformer on
2x2-packed latents, the Qwen-Image VAE) at diffusers' own fast-test widths; the VAE is narrower than diffusers'
test one (base_dim 4 instead of 24) so the folder stays well under 1 MB. Needs transformers with
Qwen2.5-VL (>= 4.49).
"""

from __future__ import annotations

from pathlib import Path

from ._common import diffusers_dir, save_pipeline_atomically, seeded
from .tokenizers import build_qwen_style_tokenizer

QWEN_IMAGE_NAME = "tiny-qwen-image"
LATENT_CHANNELS = 4
TEXT_DIM = 16


def text_encoder(tokenizer, vision_ids: dict | None = None):
    """The tiny Qwen2.5-VL; ``vision_ids`` ({config field: token id}) points its vision token ids at the
    tokenizer's vision tokens (the edit models read images), else at the last id (text-to-image reads none)."""
    try:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    except ImportError as exc:  # pragma: no cover - depends on the installed transformers
        raise ImportError("building tiny-qwen-image needs transformers >= 4.49 (Qwen2.5-VL)") from exc

    vocab = len(tokenizer)
    last_id = vocab - 1  # image/video token ids only matter for image inputs; keep them inside the tiny vocab
    ids = {name: last_id for name in ("vision_start_token_id", "vision_end_token_id", "vision_token_id",
                                      "image_token_id", "video_token_id")}
    ids.update(vision_ids or {})
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": TEXT_DIM, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 2, "vocab_size": vocab, "rope_theta": 1000000.0,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        },
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=TEXT_DIM, vocab_size=vocab, **ids,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def transformer(**options):
    """The tiny MMDiT; ``options`` are extra config fields (Qwen-Image-Edit-2511's ``zero_cond_t``)."""
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=LATENT_CHANNELS * 4, out_channels=LATENT_CHANNELS, num_layers=2,
        attention_head_dim=16, num_attention_heads=3, joint_attention_dim=TEXT_DIM, guidance_embeds=False,
        axes_dims_rope=(8, 4, 4), **options,
    )


def vae(spatial_downsamples: int = 2):
    """The tiny Qwen-Image VAE, 2**``spatial_downsamples`` times smaller per side (the real one: 3, i.e. 8x)."""
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(
        base_dim=4, z_dim=LATENT_CHANNELS, dim_mult=[1] * (spatial_downsamples + 1), num_res_blocks=1,
        temperal_downsample=[False] + [True] * (spatial_downsamples - 1),
        latents_mean=[0.0] * LATENT_CHANNELS, latents_std=[1.0] * LATENT_CHANNELS,
    )


def build_qwen_image_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    tokenizer = build_qwen_style_tokenizer()
    with seeded(0):
        encoder = text_encoder(tokenizer)
    with seeded(1):
        autoencoder = vae()
    with seeded(2):
        denoiser = transformer()
    return QwenImagePipeline(transformer=denoiser, vae=autoencoder, scheduler=FlowMatchEulerDiscreteScheduler(),
                             text_encoder=encoder, tokenizer=tokenizer)


def build_tiny_qwen_image(models_root) -> Path:
    return save_pipeline_atomically(build_qwen_image_pipeline(), diffusers_dir(models_root) / QWEN_IMAGE_NAME)
