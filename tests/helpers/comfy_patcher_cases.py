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
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.families.qwen_image.key_layouts import QWEN_IMAGE_TRANSFORMER
from lorabind.loaders.families.wan.key_layouts import WAN_TRANSFORMER
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.models.single_file.native_files import native_tensors
from lorabind.loaders.models.single_file.pipelines import detect_set, load_single_files
from lorabind.loaders.models.store import load_model
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
    from_folder: bool = False  # our fuse loads the diffusers folder (no single-file set of it is written)
    since: str = ""  # the first ComfyUI version with this model ("" = every version the tests run)
    why_since: str = ""


# Qwen-Image-Edit-2511 as ComfyUI's files carry it: the tiny Edit-Plus transformer (2511's config) with the empty
# marker tensor ComfyUI's detection reads (``write_edit_2511_file``).
EDIT_2511_MARKER = "__index_timestep_zero__"
EDIT_2511_CASE = Case(fixtures.QWEN_EDIT_LIGHTNING, "qwen_image_edit_2511_tiny", "tiny-qwen-image-edit-plus",
                      "transformer", _QWEN_PARTS, from_folder=True, since="0.30.0",
                      why_since="ComfyUI 0.3.64 has no Qwen-Image-Edit-2511 model (no index_timestep_zero reference "
                                "method): it loads a 2511 file as Qwen-Image and ignores its marker")

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
    "qwen_image_edit_2511": EDIT_2511_CASE,
}


# A PEFT folder using every scale rule PEFT has, written at test time from the build-tiny PEFT fixture (whose
# config uses plain alpha/r only): rsLoRA (alpha/sqrt(r)), a rank_pattern that gives the cross-attention q/k/v
# rank 2 (their factors are cut to 2), an alpha_pattern for the output projections. Expected module scales:
# self-attention q/k/v 16/sqrt(4) = 8, cross-attention q/k/v 16/sqrt(2), output projections 3/sqrt(4) = 1.5.
PEFT_SCALING_FOLDER = "peft-scaling/tiny-wan21-rslora-patterns"
PEFT_SCALING_CONFIG = {"use_rslora": True, "rank_pattern": {r"attn2\.to_[qkv]": 2},
                       "alpha_pattern": {r"to_out\.0": 3.0}}
PEFT_SCALING_CASE = Case(PEFT_SCALING_FOLDER, "wan2.1_t2v_tiny", "tiny-wan21-t2v", "transformer", _WAN_PARTS)


def expected_peft_scale(module: str) -> float:
    """The scale PEFT's rules give ``module`` (a diffusers module path) in the PEFT_SCALING_FOLDER adapter."""
    if module.endswith("to_out.0"):
        return 3.0 / 2.0
    return 16.0 / 2.0 ** 0.5 if ".attn2." in f".{module}." else 16.0 / 2.0


def write_peft_scaling_folder(models_root: Path) -> str:
    """Write PEFT_SCALING_FOLDER under the loras root from the build-tiny PEFT fixture; returns its name."""
    source = models_root / "loras" / fixtures.PEFT_FOLDER
    config = {**json.loads((source / "adapter_config.json").read_text()), **PEFT_SCALING_CONFIG}
    assert config["r"] == 4 and config["lora_alpha"] == 16, "the fixture's config changed: update the expectations"
    rank2 = re.compile(r".*\.attn2\.to_[qkv]\.lora_([AB])\.weight$")
    tensors = {}
    for key, value in load_file(str(source / "adapter_model.safetensors")).items():
        cut = rank2.match(key)
        tensors[key] = value if cut is None else (value[:2] if cut.group(1) == "A" else value[:, :2]).contiguous()
    folder = models_root / "loras" / PEFT_SCALING_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return PEFT_SCALING_FOLDER


def write_edit_2511_file(models_root: Path) -> Path:
    """EDIT_2511_CASE's denoiser under diffusion_models/: the Edit-Plus folder's transformer in ComfyUI's layout and
    bf16, plus the 2511 marker."""
    transformer = load_file(str(models_root / "diffusers" / EDIT_2511_CASE.folder / "transformer" /
                                "diffusion_pytorch_model.safetensors"))
    tensors = {**native_tensors(transformer, QWEN_IMAGE_TRANSFORMER), EDIT_2511_MARKER: torch.empty(0)}
    path = models_root / "diffusion_models" / SUBFOLDER / f"{EDIT_2511_CASE.denoiser}_bf16.safetensors"
    save_file({key: value.contiguous() for key, value in tensors.items()}, str(path))
    return path


def comfy_overrides(models_root: Path, case: Case) -> dict:
    """The sizes ComfyUI fixes instead of reading them from the file, set to the tiny model's (its config)."""
    config = json.loads((models_root / "diffusers" / case.folder / case.component / "config.json").read_text())
    if case.parts is _QWEN_PARTS:
        return {key: config[key] for key in ("num_attention_heads", "attention_head_dim", "joint_attention_dim",
                                             "out_channels", "axes_dims_rope", "patch_size")}
    return {"num_heads": config["num_attention_heads"], "text_dim": config["text_dim"]}


def probe_prompt(models_root: Path, label: str, case: Case, strength: float = 1.0,
                 node: str = "LoraBindLoRA") -> dict:
    inputs = {"node": node, "denoiser": f"{SUBFOLDER}/{case.denoiser}_bf16.safetensors", "lora_name": case.lora,
              "strength": strength, "lenient": False, "config": json.dumps(comfy_overrides(models_root, case)),
              "out_name": f"patched_{label}"}
    return {"1": {"class_type": PROBE, "inputs": inputs}}


def _part(models_root: Path, relative: str) -> tuple:
    folder, name = relative.split("/")
    return str(models_root / folder / SUBFOLDER / name), name


def our_fused_weights(models_root: Path, case: Case) -> dict:
    """{native key: float32 value} of the denoiser after our own fuse of the case's LoRA at strength 1."""
    if case.from_folder:
        model = load_model(str(models_root / "diffusers" / case.folder), name=case.folder, dtype=torch.bfloat16)
        return _fused(model, models_root, case)
    denoiser = f"{case.denoiser}_bf16.safetensors"
    files = detect_set([_part(models_root, f"diffusion_models/{denoiser}")], _part(models_root, case.parts["vae"]),
                       _part(models_root, case.parts["te"]),
                       _part(models_root, _CLIP_VISION) if case.image_encoder else None)
    tokenizers = [models_root / "diffusers" / case.folder / "tokenizer"]  # the single file carries none
    return _fused(load_single_files(files, dtype="bfloat16", tokenizer_dirs=tokenizers), models_root, case)


def _fused(model, models_root: Path, case: Case) -> dict:
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
