"""MiniMax-H3's native transformer key layout, the inverse of diffusers' single-file converter
(``convert_minimax_h3_transformer_checkpoint_to_diffusers``, 0.42). lorabind does not load MiniMax-H3 single files
(``REFUSED_FILES`` says why and what to use instead, on its layout), but ComfyUI 0.30's own MiniMax-H3 model has
these names in its state dict (``comfy/ldm/minimax/model.py``: fused ``qkv_proj`` as [Q; K; V], ``mlp.fc1`` as
[gate; value]), so the ComfyUI-native nodes map LoRAs onto it through this layout (``HOST_DENOISERS``).
"""

from __future__ import annotations

from ...io.key_layouts import Fused, KeyLayout
from ...io.single_file_kinds import HostDenoiser, RefusedKind

MINIMAX_H3_TRANSFORMER = KeyLayout("minimax_h3_transformer", (
    ("transformer_blocks.{i}.attn.norm_q", "blocks.{i}.attn.q_norm"),
    ("transformer_blocks.{i}.attn.norm_k", "blocks.{i}.attn.k_norm"),
    ("transformer_blocks.{i}.attn.to_out.0", "blocks.{i}.attn.out_proj"),
    ("transformer_blocks.{i}.ff.net.0.proj", "blocks.{i}.mlp.fc1"),
    ("transformer_blocks.{i}.ff.net.2", "blocks.{i}.mlp.fc2"),
    ("transformer_blocks", "blocks"),
    ("token_refiner.refiner_blocks.{i}.attn.norm_q", "token_refiner.blocks.{i}.attn.q_norm"),
    ("token_refiner.refiner_blocks.{i}.attn.norm_k", "token_refiner.blocks.{i}.attn.k_norm"),
    ("token_refiner.refiner_blocks.{i}.attn.to_out.0", "token_refiner.blocks.{i}.attn.out_proj"),
    ("token_refiner.refiner_blocks.{i}.ff.net.0.proj", "token_refiner.blocks.{i}.mlp.fc1"),
    ("token_refiner.refiner_blocks.{i}.ff.net.2", "token_refiner.blocks.{i}.mlp.fc2"),
    ("token_refiner.refiner_blocks", "token_refiner.blocks"),
    ("time_embedder.linear_1", "time_embedder.proj_in"),
    ("time_embedder.linear_2", "time_embedder.proj_out"),
    ("proj_in", "video_patch_proj"),
    ("audio_proj_in", "audio_patch_proj"),
    ("context_embedder", "condition_proj"),
    ("norm_out.norm", "final_layer.norm"),
    ("norm_out.linear", "final_layer.adaln_proj.linear"),
    ("proj_out", "final_layer.video_out"),
    ("audio_proj_out", "final_layer.audio_out"),
), fused=(
    *(Fused(f"{native}.{{i}}.attn.qkv_proj", tuple(f"{ours}.{{i}}.attn.to_{p}" for p in "qkv"))
      for ours, native in (("transformer_blocks", "blocks"), ("token_refiner.refiner_blocks", "token_refiner.blocks"))),
    *(Fused(f"{native}.{{i}}.mlp.fc1", (f"{ours}.{{i}}.ff.net.0.proj",), swap_halves=True)
      for ours, native in (("transformer_blocks", "blocks"), ("token_refiner.refiner_blocks", "token_refiner.blocks"))),
), native_only=("rope.inv_freq",))

# Native names as diffusers' MiniMax-H3 single-file converter reads them (``MINIMAX_H3_TRANSFORMER``), or the
# diffusers names; the pipeline also needs the video VAE, the audio VAE and the Qwen3 text encoder, which
# lorabind reads only from the diffusers folder.
REFUSED_FILES = (
    RefusedKind("MiniMax-H3 denoiser",
                (("video_patch_proj.weight", "audio_patch_proj.weight"),
                 ("proj_in.weight", "audio_proj_in.weight", "context_embedder.weight")),
                "MiniMax-H3 runs from its diffusers folder only (transformer, video and audio VAEs and text encoder "
                "together): put the folder under models/diffusers/ and load it with LoraBindModelLoader (\"Load "
                "Diffusers Model (lorabind)\")"),
)

# ComfyUI's model detection knows MiniMax-H3 by these two keys (``comfy/model_detection.py``, 0.30.0)
HOST_DENOISERS = (HostDenoiser(markers=("video_patch_proj.weight", "audio_patch_proj.weight"),
                               layout=MINIMAX_H3_TRANSFORMER),)
