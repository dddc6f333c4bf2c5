"""Patcher equality in real ComfyUI: one case per LoRA fixture ``build-tiny`` makes, the probe prompt that patches
ComfyUI's own model class with ``LoraBindLoRA`` (``tests/data/comfy_test_pack/patcher_probe.py``), and our own
fuse of the same file into the same single file (``LoraBindCheckpointLoader``'s loader + ``bind``) to compare with.

ComfyUI builds the model in bfloat16 (the probe asks for it: the weight dtype of the published bf16 files), so it
rounds twice: the file's float32-kept weights (norms, modulation, time embedding) when it loads them, and each
patched value when it writes it. Our fuse keeps those weights in float32. "Equal within the rounding of ComfyUI's
weight dtype" is therefore |ComfyUI - ours| <= eps(bf16) x (|original| + |ours|) per element.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.models.single_file.layouts import QWEN_IMAGE_TRANSFORMER, WAN_TRANSFORMER
from lorabind.loaders.models.single_file.pipelines import detect_set, load_single_files
from lorabind.tiny_models import lora_fixtures as fixtures
from lorabind.tiny_models.single_files import SUBFOLDER

PROBE = "LoraBindTestPatcherProbe"
WEIGHT_DTYPE = torch.bfloat16  # what the probe builds ComfyUI's model in
_WAN_PARTS = {"vae": "vae/wan_2.1_vae_tiny.safetensors", "te": "text_encoders/umt5_tiny_bf16.safetensors",
              "layout": WAN_TRANSFORMER}
_QWEN_PARTS = {"vae": "vae/qwen_image_vae_tiny.safetensors", "te": "text_encoders/qwen_2.5_vl_tiny_bf16.safetensors",
               "layout": QWEN_IMAGE_TRANSFORMER}
_CLIP_VISION = "clip_vision/clip_vision_tiny.safetensors"


@dataclass(frozen=True)
class Case:
    lora: str  # name under the loras root
    denoiser: str  # file stem under diffusion_models/lorabind-tiny/ (bf16)
    folder: str  # the tiny diffusers folder it was converted from (its config gives ComfyUI's fixed sizes)
    component: str
    parts: dict
    image_encoder: bool = False


CASES = {
    "wan22_t2v_high": Case(fixtures.WAN22_HIGH, "wan2.2_t2v_high_noise_tiny", "tiny-wan22-t2v", "transformer",
                           _WAN_PARTS),
    "wan22_t2v_low": Case(fixtures.WAN22_LOW, "wan2.2_t2v_low_noise_tiny", "tiny-wan22-t2v", "transformer_2",
                          _WAN_PARTS),
    "wan21_t2v": Case(fixtures.WAN21_DISTILL, "wan2.1_t2v_tiny", "tiny-wan21-t2v", "transformer", _WAN_PARTS),
    "wan21_peft_folder": Case(fixtures.PEFT_FOLDER, "wan2.1_t2v_tiny", "tiny-wan21-t2v", "transformer",
                              _WAN_PARTS),
    "wan22_i2v_high": Case(fixtures.WAN22_I2V_HIGH, "wan2.2_i2v_high_noise_tiny", "tiny-wan22-i2v", "transformer",
                           _WAN_PARTS),
    "wan22_i2v_low": Case(fixtures.WAN22_I2V_LOW, "wan2.2_i2v_low_noise_tiny", "tiny-wan22-i2v", "transformer_2",
                          _WAN_PARTS),
    "wan21_i2v": Case(fixtures.WAN21_I2V_DISTILL, "wan2.1_i2v_tiny", "tiny-wan21-i2v", "transformer", _WAN_PARTS,
                      image_encoder=True),
    "qwen_image_lightning": Case(fixtures.QWEN_LIGHTNING, "qwen_image_tiny", "tiny-qwen-image", "transformer",
                                 _QWEN_PARTS),
}


def comfy_overrides(models_root: Path, case: Case) -> dict:
    """The sizes ComfyUI fixes instead of reading them from the file, set to the tiny model's (its config)."""
    config = json.loads((models_root / "diffusers" / case.folder / case.component / "config.json").read_text())
    if case.parts is _QWEN_PARTS:
        return {key: config[key] for key in ("num_attention_heads", "attention_head_dim", "joint_attention_dim",
                                             "out_channels", "axes_dims_rope", "patch_size")}
    return {"num_heads": config["num_attention_heads"], "text_dim": config["text_dim"]}


def probe_prompt(models_root: Path, label: str, case: Case, strength: float = 1.0) -> dict:
    inputs = {"denoiser": f"{SUBFOLDER}/{case.denoiser}_bf16.safetensors", "lora_name": case.lora,
              "strength": strength, "lenient": False, "config": json.dumps(comfy_overrides(models_root, case)),
              "out_name": f"patched_{label}"}
    return {"1": {"class_type": PROBE, "inputs": inputs}}


def _part(models_root: Path, relative: str) -> tuple:
    folder, name = relative.split("/")
    return str(models_root / folder / SUBFOLDER / name), name


def our_fused_weights(models_root: Path, case: Case) -> dict:
    """{native key: float32 value} of the denoiser after our own fuse of the case's LoRA at strength 1."""
    denoiser = f"{case.denoiser}_bf16.safetensors"
    files = detect_set([_part(models_root, f"diffusion_models/{denoiser}")], _part(models_root, case.parts["vae"]),
                       _part(models_root, case.parts["te"]),
                       _part(models_root, _CLIP_VISION) if case.image_encoder else None)
    tokenizers = [models_root / "diffusers" / case.folder / "tokenizer"]  # the single file carries none
    model = load_single_files(files, dtype="bfloat16", tokenizer_dirs=tokenizers)
    component = binding.main_denoiser(model)
    binding.bind(model, [FuseSpec(str(models_root / "loras" / case.lora), 1.0, component, case.lora)], [])
    try:
        layout = case.parts["layout"]
        return {layout.to_native(key): value.detach().float().clone()
                for key, value in model.components[component].state_dict().items()}
    finally:
        binding.unbind(model)


def rounding_excess(theirs: torch.Tensor, ours: torch.Tensor, original: torch.Tensor) -> float:
    """How far beyond ComfyUI's two roundings the values differ (<= 0: within them), relative to the bound."""
    bound = torch.finfo(WEIGHT_DTYPE).eps * (original.float().abs() + ours.abs()) + torch.finfo(torch.float32).tiny
    return float(((theirs - ours).abs() / bound).max()) - 1.0
