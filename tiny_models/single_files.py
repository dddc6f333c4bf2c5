"""Tiny single-file versions of the tiny models, in ComfyUI's folders and native key layouts.

``lorabind models build-tiny`` writes them next to the diffusers folders, converted from those folders' weights
by the native layouts (the inverse of diffusers' single-file converters), so the single-file loader and the
checkpoint-loader node have real files to work on offline. All under a ``lorabind-tiny/`` subfolder of
``diffusion_models/``, ``vae/``, ``text_encoders/`` and ``clip_vision/`` so a user's own folders are never
cluttered. Names keep the grammar of the published files (``wan2.2_t2v_high_noise_<size>_<precision>``) with
``tiny`` as the size, so the name-based checks (high/low expert) apply to them too. The Wan2.2 experts and
Qwen-Image are also written as Q8_0 and Q4_0 GGUF files (``gguf_files``) from the bf16 file's tensors.
"""

from __future__ import annotations

from pathlib import Path

from ..loaders.families.qwen_image import key_layouts as qwen_layouts
from ..loaders.families.wan import key_layouts as layouts
from ..loaders.families.wan.slots import LOW_NOISE_EXPERT  # the low-noise expert's component name
from ..loaders.families.wan.tokenizer import build_spiece_model
from ..loaders.models.single_file.native_files import PRECISIONS, native_tensors
from ._common import diffusers_dir
from .gguf_files import GGUF_QUANTS, GGUF_STEMS, write_gguf_files
from .lora_fixtures import _write_if_changed
from .qwen_image import QWEN_IMAGE_NAME, build_tiny_qwen_image
from .wan import WAN21_NAME, WAN22_NAME, build_tiny_wan21, build_tiny_wan22
from .wan_i2v import (
    WAN21_I2V_NAME,
    WAN22_I2V_NAME,
    WAN22_TI2V_NAME,
    build_tiny_wan21_i2v,
    build_tiny_wan22_i2v,
    build_tiny_wan22_ti2v,
)
from .wan_vace import WAN21_VACE_NAME, WAN22_VACE_FUN_NAME, build_tiny_wan21_vace, build_tiny_wan22_vace_fun

SUBFOLDER = "lorabind-tiny"
# file stem (before _<precision>) -> (diffusers folder, component, layout, quantized prefix, model class)
DENOISER_FILES = {
    "wan2.2_t2v_high_noise_tiny": (WAN22_NAME, "transformer", layouts.WAN_TRANSFORMER, "blocks.",
                                   "WanTransformer3DModel"),
    "wan2.2_t2v_low_noise_tiny": (WAN22_NAME, LOW_NOISE_EXPERT, layouts.WAN_TRANSFORMER, "blocks.",
                                  "WanTransformer3DModel"),
    "wan2.1_t2v_tiny": (WAN21_NAME, "transformer", layouts.WAN_TRANSFORMER, "blocks.", "WanTransformer3DModel"),
    "wan2.2_i2v_high_noise_tiny": (WAN22_I2V_NAME, "transformer", layouts.WAN_TRANSFORMER, "blocks.",
                                   "WanTransformer3DModel"),
    "wan2.2_i2v_low_noise_tiny": (WAN22_I2V_NAME, LOW_NOISE_EXPERT, layouts.WAN_TRANSFORMER, "blocks.",
                                  "WanTransformer3DModel"),
    "wan2.1_i2v_tiny": (WAN21_I2V_NAME, "transformer", layouts.WAN_TRANSFORMER, "blocks.", "WanTransformer3DModel"),
    "wan2.2_ti2v_tiny": (WAN22_TI2V_NAME, "transformer", layouts.WAN_TRANSFORMER, "blocks.", "WanTransformer3DModel"),
    # ComfyUI's repackaged names: wan2.1_vace_14B_fp16, wan2.2_fun_vace_{high,low}_noise_14B_bf16
    "wan2.1_vace_tiny": (WAN21_VACE_NAME, "transformer", layouts.WAN_VACE_TRANSFORMER, "blocks.",
                         "WanVACETransformer3DModel"),
    "wan2.2_fun_vace_high_noise_tiny": (WAN22_VACE_FUN_NAME, "transformer", layouts.WAN_VACE_TRANSFORMER, "blocks.",
                                        "WanVACETransformer3DModel"),
    "wan2.2_fun_vace_low_noise_tiny": (WAN22_VACE_FUN_NAME, LOW_NOISE_EXPERT, layouts.WAN_VACE_TRANSFORMER,
                                       "blocks.", "WanVACETransformer3DModel"),
    "qwen_image_tiny": (QWEN_IMAGE_NAME, "transformer", qwen_layouts.QWEN_IMAGE_TRANSFORMER, "transformer_blocks.",
                        "QwenImageTransformer2DModel"),
}
VAE_FILES = {"wan_2.1_vae_tiny.safetensors": WAN22_NAME, "qwen_image_vae_tiny.safetensors": QWEN_IMAGE_NAME,
             "wan2.2_vae_tiny.safetensors": WAN22_TI2V_NAME}
UMT5_STEM = "umt5_tiny"
QWEN25_VL_FILE = "qwen_2.5_vl_tiny_bf16.safetensors"
QWEN25_VL_FP8_FILE = "qwen_2.5_vl_tiny_fp8_scaled.safetensors"  # as ComfyUI's qwen_2.5_vl_7b_fp8_scaled
CLIP_VISION_FILE = "clip_vision_tiny.safetensors"  # Wan2.1 I2V's image encoder (ComfyUI: models/clip_vision)
# the folder each single file was converted from (tests compare the two)
SOURCE_FOLDERS = {**{stem: spec[0] for stem, spec in DENOISER_FILES.items()}, **VAE_FILES,
                  UMT5_STEM: WAN22_NAME, QWEN25_VL_FILE: QWEN_IMAGE_NAME, QWEN25_VL_FP8_FILE: QWEN_IMAGE_NAME, CLIP_VISION_FILE: WAN21_I2V_NAME}


def _save(path: Path, tensors: dict) -> Path:
    from safetensors.torch import save

    path.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(path, save({k: v.contiguous() for k, v in tensors.items()}))
    return path


def _component(folder: Path, name: str) -> dict:
    from safetensors.torch import load_file

    files = sorted((folder / name).glob("*.safetensors"))
    state_dict = {}
    for file in files:
        state_dict.update(load_file(str(file)))
    return state_dict


def _umt5_pieces(folder: Path) -> list:
    """The tiny folder tokenizer's Unigram pieces and scores, in id order."""
    import json

    model = json.loads((folder / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    return [(piece, float(score)) for piece, score in model["vocab"]]


def write_tiny_single_files(models_root) -> list[Path]:
    """Write every tiny single file whose source folder exists under ``models_root/diffusers``; return them."""
    import torch

    models_root = Path(models_root)
    source_root = diffusers_dir(models_root)
    written = []
    import diffusers

    for stem, (model, component, layout, prefix, class_name) in DENOISER_FILES.items():
        if not (source_root / model / "model_index.json").is_file():
            continue
        state_dict = _component(source_root / model, component)
        keep = getattr(diffusers, class_name)._keep_in_fp32_modules
        folder = models_root / "diffusion_models" / SUBFOLDER
        for precision in PRECISIONS:
            tensors = native_tensors(state_dict, layout, precision=precision, quantized_prefix=prefix,
                                     keep_fp32_modules=keep)
            written.append(_save(folder / f"{stem}_{precision}.safetensors", tensors))
            if precision == "bf16" and stem in GGUF_STEMS:  # quantized from exactly the bf16 file's values
                written += write_gguf_files(folder, stem, tensors, prefix, class_name)
    for name, model in VAE_FILES.items():
        if (source_root / model / "model_index.json").is_file():
            import json

            config = json.loads((source_root / model / "vae" / "config.json").read_text(encoding="utf-8"))
            tensors = native_tensors(_component(source_root / model, "vae"), layouts.vae_layout_for(config))
            written.append(_save(models_root / "vae" / SUBFOLDER / name, tensors))
    wan = source_root / WAN22_NAME
    if (wan / "model_index.json").is_file():
        spiece = torch.frombuffer(bytearray(build_spiece_model(_umt5_pieces(wan))), dtype=torch.uint8)
        encoder = _component(wan, "text_encoder")
        for precision, suffix in (("bf16", "bf16"), ("fp8_scaled", "fp8_e4m3fn_scaled")):
            tensors = native_tensors(encoder, layouts.UMT5_ENCODER, precision=precision,
                                     quantized_prefix="encoder.block.")
            tensors[layouts.SPIECE_KEY] = spiece
            written.append(_save(models_root / "text_encoders" / SUBFOLDER / f"{UMT5_STEM}_{suffix}.safetensors",
                                 tensors))
    qwen = source_root / QWEN_IMAGE_NAME
    if (qwen / "model_index.json").is_file():
        encoder = _component(qwen, "text_encoder")
        for precision, name in (("bf16", QWEN25_VL_FILE), ("fp8_scaled", QWEN25_VL_FP8_FILE)):
            tensors = native_tensors(encoder, qwen_layouts.QWEN25_VL_ENCODER, precision=precision,
                                     quantized_prefix="model.layers.")
            written.append(_save(models_root / "text_encoders" / SUBFOLDER / name, tensors))
    clip = source_root / WAN21_I2V_NAME
    if (clip / "model_index.json").is_file():
        tensors = native_tensors(_component(clip, "image_encoder"), layouts.CLIP_VISION_ENCODER)
        written.append(_save(models_root / "clip_vision" / SUBFOLDER / CLIP_VISION_FILE, tensors))
    return written


def tiny_file_names() -> dict[str, list[str]]:
    """{ComfyUI folder kind: names relative to it} of every tiny single file ``write_tiny_single_files`` writes."""
    denoisers = [f"{SUBFOLDER}/{stem}_{p}.safetensors" for stem in DENOISER_FILES for p in PRECISIONS]
    denoisers += [f"{SUBFOLDER}/{stem}_{quant}.gguf" for stem in GGUF_STEMS for quant in GGUF_QUANTS]
    encoders = [f"{SUBFOLDER}/{UMT5_STEM}_{s}.safetensors" for s in ("bf16", "fp8_e4m3fn_scaled")]
    return {"diffusion_models": denoisers, "vae": [f"{SUBFOLDER}/{n}" for n in VAE_FILES],
            "text_encoders": encoders + [f"{SUBFOLDER}/{QWEN25_VL_FILE}"],
            "clip_vision": [f"{SUBFOLDER}/{CLIP_VISION_FILE}"]}


def ensure_tiny_single_files(named, models_root) -> list[str]:
    """Build the tiny single files (and the tiny folders they come from) when a name in ``named`` is missing.

    Returns the missing names that now exist."""
    models_root = Path(models_root)
    missing = [(kind, name) for kind, names in tiny_file_names().items() for name in names
               if name in named and not (models_root / kind / name).is_file()]
    if not missing:
        return []
    for model, build in ((WAN22_NAME, build_tiny_wan22), (WAN21_NAME, build_tiny_wan21),
                         (QWEN_IMAGE_NAME, build_tiny_qwen_image), (WAN22_I2V_NAME, build_tiny_wan22_i2v),
                         (WAN21_I2V_NAME, build_tiny_wan21_i2v), (WAN22_TI2V_NAME, build_tiny_wan22_ti2v),
                         (WAN21_VACE_NAME, build_tiny_wan21_vace), (WAN22_VACE_FUN_NAME, build_tiny_wan22_vace_fun)):
        if not (diffusers_dir(models_root) / model / "model_index.json").is_file():
            build(models_root)
    write_tiny_single_files(models_root)
    return [name for kind, name in missing if (models_root / kind / name).is_file()]
