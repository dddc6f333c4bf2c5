"""Tiny files that ComfyUI's own loaders accept, for the ComfyUI-native nodes' example on the tiny models.

Why a variant: ComfyUI reads some sizes from a file and fixes others. Its Wan denoiser (UNETLoader) takes the
width, FFN width, layer count and input channels from the file, but the head count is always width / 128 and the
text-embedding input always 4096 wide (UMT5-XXL), so our 24-wide tiny Wan does not load there. This variant is
128 wide (one head of 128) with a 4096-wide text embedding: ComfyUI detects it as a Wan T2V denoiser, the model
class it uses for Wan2.2 A14B's experts. Each expert gets its lightx2v LoRA under the published name (the
contract and expert checks read names), shaped for this variant, in ``loras/lorabind-tiny/comfyui/``.

ComfyUI's Wan2.1 VAE (VAELoader) is always the full configuration (about 127M parameters, 250 MB in bf16), so
it is written only on request (``build-tiny --comfyui``), with random weights, never shipped.

With a diffusers that has MiniMax-H3 (0.42), also ComfyUI 0.30's tiny MiniMax-H3 denoiser
(``comfyui_minimax``), whose LoRAs are the MiniMax-H3 fixture files ``build-tiny`` writes anyway.
"""

from __future__ import annotations

from pathlib import Path

from ..loaders.families.wan import key_layouts as layouts
from ..loaders.models import compat
from ..loaders.models.single_file.native_files import native_tensors
from ._common import FIXTURE_LORA_FOLDER, seeded
from .comfyui_minimax import MINIMAX_REQUIREMENT, write_comfyui_minimax
from .comfyui_qwen_image import write_comfyui_qwen_image
from .lora_fixtures import save_fixture, wan_native_lora
from .single_files import SUBFOLDER, _save

COMFY_TEXT_DIM = 4096  # ComfyUI's WanModel text_dim (not read from the file)
COMFY_HEAD_DIM = 128  # ComfyUI's WanModel num_heads = dim // 128
COMFY_CONFIG = {"patch_size": (1, 2, 2), "num_attention_heads": 1, "attention_head_dim": COMFY_HEAD_DIM,
                "in_channels": 16, "out_channels": 16, "text_dim": COMFY_TEXT_DIM, "freq_dim": 256, "ffn_dim": 64,
                "num_layers": 2, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}
DENOISERS = {"high": f"{SUBFOLDER}/wan2.2_t2v_high_noise_comfyui_tiny_bf16.safetensors",
             "low": f"{SUBFOLDER}/wan2.2_t2v_low_noise_comfyui_tiny_bf16.safetensors"}
LORAS = {
    "high": f"{FIXTURE_LORA_FOLDER}/comfyui/wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors",
    "low": f"{FIXTURE_LORA_FOLDER}/comfyui/wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors"}
FULL_VAE = f"{SUBFOLDER}/wan_2.1_vae_random_full.safetensors"
_SEEDS = {"high": (31, 131), "low": (32, 132)}  # (denoiser, LoRA)


def write_comfyui_files(models_root, *, with_vae: bool = True) -> list[Path]:
    """Write both experts (diffusion_models/), their LoRA pair (loras/), the Qwen-Image twin and its Lightning LoRA
    (``comfyui_qwen_image``) and, with ``with_vae``, the full-size random Wan2.1 VAE (vae/) under ``models_root``;
    return the paths."""
    import diffusers

    root = Path(models_root)
    written = []
    keep = diffusers.WanTransformer3DModel._keep_in_fp32_modules
    for expert, (model_seed, lora_seed) in _SEEDS.items():
        with seeded(model_seed):
            model = diffusers.WanTransformer3DModel(**COMFY_CONFIG)
        tensors = native_tensors(model.state_dict(), layouts.WAN_TRANSFORMER, keep_fp32_modules=keep)
        written.append(_save(root / "diffusion_models" / DENOISERS[expert], tensors))
        written.append(save_fixture(root / "loras" / LORAS[expert], wan_native_lora(COMFY_CONFIG, seed=lora_seed)))
    written += write_comfyui_qwen_image(root)
    if with_vae:
        written.append(write_full_vae(root / "vae" / FULL_VAE))
    if not compat.unmet_requirements(MINIMAX_REQUIREMENT):
        written += write_comfyui_minimax(root)
    return written


def write_full_vae(path: Path) -> Path:
    """ComfyUI's Wan2.1 VAE at its one configuration (diffusers' defaults), random weights, in bf16."""
    import diffusers

    with seeded(33):
        vae = diffusers.AutoencoderKLWan()
    config = dict(vae.config)
    return _save(path, native_tensors(vae.state_dict(), layouts.vae_layout_for(config)))
