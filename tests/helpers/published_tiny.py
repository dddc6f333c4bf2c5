"""Tiny files under the real published names, for a fake hub (``fake_hub.FakeHub``): every URL of the published
table (``loaders.placement.published``) is served, with a tiny single file of the same kind where one exists, so
that what lands in the models folder reads as what it is named (``models check`` finds it) and loads.
"""

from __future__ import annotations

from pathlib import Path

from lorabind.loaders.placement.published import known_sources
from lorabind.usecases.hub_files import hub_file

TINY = "lorabind-tiny/"
# published "folder/name" -> the tiny file under the same folder that stands in for it
STAND_INS = {
    "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": "wan2.2_t2v_high_noise_tiny_fp8_scaled.safetensors",
    "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": "wan2.2_t2v_low_noise_tiny_fp8_scaled.safetensors",
    "diffusion_models/wan2.2_t2v_high_noise_14B_fp16.safetensors": "wan2.2_t2v_high_noise_tiny_bf16.safetensors",
    "diffusion_models/wan2.2_t2v_low_noise_14B_fp16.safetensors": "wan2.2_t2v_low_noise_tiny_bf16.safetensors",
    "diffusion_models/Wan2.2-T2V-A14B-HighNoise-Q4_0.gguf": "wan2.2_t2v_high_noise_tiny_Q4_0.gguf",
    "diffusion_models/Wan2.2-T2V-A14B-LowNoise-Q4_0.gguf": "wan2.2_t2v_low_noise_tiny_Q4_0.gguf",
    "diffusion_models/Wan2.2-T2V-A14B-HighNoise-Q8_0.gguf": "wan2.2_t2v_high_noise_tiny_Q8_0.gguf",
    "diffusion_models/Wan2.2-T2V-A14B-LowNoise-Q8_0.gguf": "wan2.2_t2v_low_noise_tiny_Q8_0.gguf",
    "diffusion_models/qwen_image_fp8_e4m3fn.safetensors": "qwen_image_tiny_fp8_e4m3fn.safetensors",
    "diffusion_models/qwen-image-Q4_0.gguf": "qwen_image_tiny_Q4_0.gguf",
    "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors": "umt5_tiny_fp8_e4m3fn_scaled.safetensors",
    "text_encoders/umt5_xxl_fp16.safetensors": "umt5_tiny_bf16.safetensors",
    "text_encoders/qwen_2.5_vl_7b.safetensors": "qwen_2.5_vl_tiny_bf16.safetensors",
    "vae/wan_2.1_vae.safetensors": "wan_2.1_vae_tiny.safetensors",
    "vae/qwen_image_vae.safetensors": "qwen_image_vae_tiny.safetensors",
}


def published_hub_files(tiny_root: Path) -> dict:
    """{"owner/name": {"path/in/repo": bytes}} for every published file: the stand-in's bytes (a LoRA: the fixture
    of the same name), else a few bytes that name the file."""
    from lorabind.tiny_models.single_files import ensure_tiny_single_files

    ensure_tiny_single_files([TINY + name for name in STAND_INS.values()], tiny_root)
    repos: dict = {}
    for destination, url in known_sources().items():
        folder, name = destination.split("/", 1)
        stand_in = tiny_root / folder / TINY / (STAND_INS.get(destination) or name)
        data = stand_in.read_bytes() if stand_in.is_file() else f"tiny stand-in for {destination}\n".encode() * 64
        file = hub_file(destination, url)
        repos.setdefault(file.repo_id, {})[file.path] = data
    return repos


def served_bytes(repos: dict, destination: str) -> bytes:
    """What the hub serves for a published ``folder/name``."""
    file = hub_file(destination, known_sources()[destination])
    return repos[file.repo_id][file.path]
