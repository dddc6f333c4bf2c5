"""A tiny Qwen-Image that ComfyUI's own ``UNETLoader`` accepts, for the Qwen-Image ComfyUI-native example's twin.

Why so wide: ComfyUI reads only the input width and the depth from a Qwen-Image file (``model_detection``: the
``txt_norm`` key, ``img_in``'s width, the block count); every other size is the real model's, fixed in its model
class: 24 heads of 128 (3072 wide), a 3584-wide text embedding, rope axes 16/56/56, 16 latent channels. So the twin
is the real width with one block (about 380M parameters, 760 MB in bf16), its weights random and small, written
only on request (``build-tiny --comfyui``). Its Lightning LoRA has the published name, shaped for it, in
``loras/lorabind-tiny/comfyui/``. The Wan2.1 VAE ``comfyui_files`` writes is Qwen-Image's VAE in ComfyUI too.
"""

from __future__ import annotations

from pathlib import Path

from ..loaders.families.qwen_image import key_layouts as qwen_layouts
from ..loaders.models.single_file.native_files import native_tensors
from ._common import FIXTURE_LORA_FOLDER
from .lora_fixtures import _qwen_lightning_lora, save_fixture
from .single_files import SUBFOLDER, _save

COMFY_QWEN_CONFIG = {"patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 1,
                     "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 3584,
                     "guidance_embeds": False, "axes_dims_rope": (16, 56, 56)}
QWEN_DENOISER = f"{SUBFOLDER}/qwen_image_comfyui_tiny_bf16.safetensors"
QWEN_LORA = f"{FIXTURE_LORA_FOLDER}/comfyui/Qwen-Image-Lightning-4steps-V1.0.safetensors"
_SEEDS = (41, 141)  # (denoiser, LoRA)


def write_comfyui_qwen_image(models_root) -> list[Path]:
    """Write the denoiser (diffusion_models/) and its Lightning LoRA (loras/) under ``models_root``."""
    root = Path(models_root)
    denoiser = _save(root / "diffusion_models" / QWEN_DENOISER,
                     native_tensors(_random_weights(_SEEDS[0]), qwen_layouts.QWEN_IMAGE_TRANSFORMER))
    lora = save_fixture(root / "loras" / QWEN_LORA, _qwen_lightning_lora(COMFY_QWEN_CONFIG, seed=_SEEDS[1]))
    return [denoiser, lora]


def _random_weights(seed: int) -> dict:
    """diffusers' QwenImageTransformer2DModel's parameters at ``COMFY_QWEN_CONFIG``, drawn directly in bf16 (the
    model is built on the meta device: its own initialisation of 380M float32 values would take longer and
    twice the memory): matrices ~ N(0, 1/fan_in), norm scales 1, biases 0."""
    import diffusers
    import torch

    with torch.device("meta"):
        model = diffusers.QwenImageTransformer2DModel(**COMFY_QWEN_CONFIG)
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, meta in model.state_dict().items():
        if meta.ndim >= 2:
            value = torch.randn(meta.shape, generator=generator) * meta.shape[1] ** -0.5
        else:
            value = torch.ones(meta.shape) if "norm" in name and name.endswith("weight") else torch.zeros(meta.shape)
        weights[name] = value.to(torch.bfloat16)
    return weights
