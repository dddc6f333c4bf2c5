"""A tiny MiniMax-H3 denoiser that ComfyUI 0.30's own loaders take (``UNETLoader``), for the ComfyUI-native example.

Why a variant of the tiny MiniMax-H3: ComfyUI detects MiniMax-H3 by ``video_patch_proj`` and
``audio_patch_proj`` and reads every width from the file (``comfy/model_detection.py``), but its latent nodes
(``EmptyMiniMaxH3LatentAV``, ``MiniMaxH3ImageToVideo``) always make 24 video and 32 audio latent channels, and its
rope table is always 16 frequencies per axis (``rope.inv_freq``, read from the file, which diffusers never
writes: it recomputes it). So this one is the tiny model's widths with 24 / 32 latent channels and a 16-entry
``rope.inv_freq``: every MiniMax-H3 fixture LoRA (``minimax_h3.write_minimax_fixture_loras``) fits it as it fits
the tiny folder. Written in the native layout ComfyUI reads (fused ``qkv_proj``, ``mlp.fc1`` gate first).
"""

from __future__ import annotations

from pathlib import Path

from ..loaders.families.minimax_h3.key_layouts import MINIMAX_H3_TRANSFORMER
from ..loaders.models.single_file.native_files import keeps_fp32, native_tensors
from ._common import seeded
from .minimax_h3 import TRANSFORMER_CONFIG
from .single_files import SUBFOLDER, _save

COMFY_LATENT_CHANNELS = {"in_channels": 24, "audio_in_channels": 32}  # what ComfyUI's latent nodes make
COMFY_ROPE_FREQUENCIES = 16  # MiniMaxH3Model(rope_inv_freq_len=16), not read from the file
COMFY_MINIMAX_CONFIG = {**TRANSFORMER_CONFIG, **COMFY_LATENT_CHANNELS, "rope_freq_dim": COMFY_ROPE_FREQUENCIES}
DENOISER = f"{SUBFOLDER}/minimax_h3_comfyui_tiny_bf16.safetensors"
MINIMAX_REQUIREMENT = "minimax_h3"  # the requirements id: diffusers' MiniMaxH3Transformer3DModel (0.42)
_SEED = 41


def comfy_minimax_transformer(dtype=None):
    """The seeded diffusers model the ComfyUI file is written from (the tests fuse into it to compare); with
    ``dtype``, cast as ``from_pretrained(torch_dtype=dtype)`` casts: the float32 modules stay float32."""
    import diffusers
    import torch

    with seeded(_SEED):
        model = diffusers.MiniMaxH3Transformer3DModel(**COMFY_MINIMAX_CONFIG)
    if dtype is not None:
        keep = type(model)._keep_in_fp32_modules
        for name, parameter in model.named_parameters():
            parameter.data = parameter.data.to(torch.float32 if keeps_fp32(name, keep) else dtype)
    return model


def write_comfyui_minimax(models_root) -> list[Path]:
    """Write the tiny ComfyUI MiniMax-H3 denoiser under ``models_root/diffusion_models``; return its path."""

    model = comfy_minimax_transformer()
    tensors = native_tensors(model.state_dict(), MINIMAX_H3_TRANSFORMER,
                             keep_fp32_modules=type(model)._keep_in_fp32_modules)
    tensors["rope.inv_freq"] = model.rope.inv_freq.detach().float().clone()
    return [_save(Path(models_root) / "diffusion_models" / DENOISER, tensors)]
