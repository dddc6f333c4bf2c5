"""Tiny Wan VACE pipelines (Wan2.1 VACE, Wan2.2 VACE Fun A14B experts), random weights, built offline.

VACE is a Wan text-to-video transformer plus a control branch: ``vace_patch_embedding`` embeds the control
latents (``vace_in_channels`` 96 = 16 inactive + 16 reactive video latent channels + 64 mask channels, one per
pixel of the VAE's 8x8 spatial cell) and ``vace_blocks`` (one per entry of ``vace_layers``) add their hints to
the main blocks at those layers. The published configs (``Wan-AI/Wan2.1-VACE-1.3B-diffusers``: 30 layers,
``vace_layers`` every second one; ``Wan-AI/Wan2.1-VACE-14B-diffusers``: 40 layers, every fifth one) are shrunk
to four layers with VACE blocks at 0 and 2, so both a block with the input projection (0) and one without run.

- ``tiny-wan21-vace``: one transformer, as the Wan2.1 VACE folders.
- ``tiny-wan22-vace-fun``: two VACE experts, high-noise ``transformer`` and low-noise ``transformer_2``, at
  ``boundary_ratio`` 0.875: Wan2.2-VACE-Fun-A14B is trained on Wan2.2-T2V-A14B (VideoX-Fun's model card), whose
  published split that is.

Main-block widths equal the tiny text-to-video models', so the tiny lightx2v fixture LoRAs fit them as the real
T2V LoRAs fit the real VACE models.
"""

from __future__ import annotations

from pathlib import Path

from ._common import diffusers_dir, save_pipeline_atomically
from .wan import TEXT_DIM, assemble_wan_pipeline

WAN21_VACE_NAME = "tiny-wan21-vace"
WAN22_VACE_FUN_NAME = "tiny-wan22-vace-fun"
VACE_LAYERS = (0, 2)
VACE_IN_CHANNELS = 96  # 2 x 16 latent channels + 8 x 8 mask channels, as in every published VACE model


def tiny_vace_transformer():
    from diffusers import WanVACETransformer3DModel

    return WanVACETransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=4, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32, vace_layers=list(VACE_LAYERS),
        vace_in_channels=VACE_IN_CHANNELS,
    )


def build_vace_pipeline(two_experts: bool):
    """The in-memory ``WanVACEPipeline``: one transformer (Wan2.1 VACE) or the Wan2.2 VACE Fun expert pair."""
    from diffusers import WanVACEPipeline

    return assemble_wan_pipeline(WanVACEPipeline, tiny_vace_transformer, (7, 8), two_experts)


def build_tiny_wan21_vace(models_root) -> Path:
    return save_pipeline_atomically(build_vace_pipeline(two_experts=False),
                                    diffusers_dir(models_root) / WAN21_VACE_NAME)


def build_tiny_wan22_vace_fun(models_root) -> Path:
    return save_pipeline_atomically(build_vace_pipeline(two_experts=True),
                                    diffusers_dir(models_root) / WAN22_VACE_FUN_NAME)
