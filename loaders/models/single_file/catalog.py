"""Every single-file component lorabind can load, as data: its config (shipped in ``configs/``), its diffusers or
transformers class, its key layout and what to call it.

Detection (``detect.py``) reads a file's header, recognises the component kind by a marker key, then compares a
shape *signature* of the file (widths, layer counts, channels) with the same signature computed from each
config of that kind; the config that matches names the size and variant. Tiny configs are the built-in tiny
models' (``lorabind models build-tiny`` writes their single files); the others are the published models'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

from . import layouts

CONFIG_DIR = Path(__file__).with_name("configs")


@dataclass(frozen=True)
class ComponentKind:
    """One kind of single file: a denoiser, VAE or text encoder of one family."""
    kind: str  # "wan_transformer", "qwen_image_transformer", "wan_vae", "umt5", "qwen25_vl", "clip_vision"
    role: str  # "denoiser", "vae", "text_encoder", "image_encoder"
    family: str  # "wan", "qwen_image"
    markers: tuple[str, ...]  # keys whose presence identifies the kind (all of them)
    library: str
    class_name: str
    file_signature: Callable[[dict], tuple]  # {key: shape} -> signature
    config_signature: Callable[[dict], tuple]  # config dict -> signature
    layout: Callable[[dict], layouts.KeyLayout]  # config -> layout
    quantized_prefix: str = "blocks."
    takes: tuple[str, ...] = ()  # denoisers: the VAE, text-encoder and image-encoder kinds they work with
    experts: bool = False  # denoisers: a model of this kind may come as two experts (Wan2.2 A14B)
    name_hint: str = ""  # a regex the file name must match to pick this kind among equal-shaped ones
    # denoisers: the ``general.architecture`` published GGUF files of this kind declare (ComfyUI-GGUF's names)
    gguf_architecture: str = ""
    excludes: tuple[str, ...] = ()  # keys whose presence rules the kind out (a Wan file with a VACE branch)
    flag_keys: tuple[str, ...] = ()  # weightless keys that mark an edition of equal shapes (Qwen-Image-Edit-2511)

    def fits(self, shapes: dict) -> bool:
        """The file has the kind's marker keys and none of its excluded keys."""
        return all(m in shapes for m in self.markers) and not any(x in shapes for x in self.excludes)


@dataclass(frozen=True)
class KnownModel:
    config: str  # file stem under configs/ (or a config.json path)
    kind: str
    title: str  # "Qwen-Image"; Wan denoisers are titled from the version/expert the file name gives
    size: str  # "1.3B", "14B", "5B", "20B", "7B", "xxl", "tiny"
    variant: Optional[str] = None  # "t2v", "i2v", "ti2v" for Wan denoisers


def _count(shapes: dict, pattern: str) -> int:
    regex = re.compile(pattern)
    return len({m[1] for key in shapes for m in [regex.match(key)] if m})


def _vae_flat_count(config: dict) -> int:
    stages, resnets = len(config["dim_mult"]), int(config["num_res_blocks"]) + 1
    return stages * resnets + stages - 1


KINDS = {kind.kind: kind for kind in (
    ComponentKind(
        "wan_transformer", "denoiser", "wan", ("head.modulation", "patch_embedding.weight"),
        "diffusers", "WanTransformer3DModel",
        lambda s: (s["patch_embedding.weight"][0], s["patch_embedding.weight"][1], _count(s, r"blocks\.(\d+)\."),
                   s["blocks.0.ffn.0.weight"][0], "img_emb.proj.1.weight" in s),
        lambda c: (c["num_attention_heads"] * c["attention_head_dim"], c["in_channels"], c["num_layers"],
                   c["ffn_dim"], c.get("image_dim") is not None),
        lambda c: layouts.WAN_TRANSFORMER, takes=("wan_vae", "wan22_vae", "umt5", "clip_vision"),
        experts=True, gguf_architecture="wan", excludes=("vace_patch_embedding.weight",)),
    # Wan VACE (comfy/model_detection.py: ``vace_patch_embedding.weight`` present -> model_type "vace", with
    # ``vace_in_dim`` its input channels and ``vace_layers`` the number of ``vace_blocks``): Wan2.1 VACE 1.3B/14B,
    # and the Wan2.2 VACE Fun A14B experts, which have Wan2.1 VACE 14B's shapes (the name tells them apart)
    ComponentKind(
        "wan_vace_transformer", "denoiser", "wan",
        ("head.modulation", "patch_embedding.weight", "vace_patch_embedding.weight"),
        "diffusers", "WanVACETransformer3DModel",
        lambda s: (s["patch_embedding.weight"][0], _count(s, r"blocks\.(\d+)\."), s["blocks.0.ffn.0.weight"][0],
                   _count(s, r"vace_blocks\.(\d+)\."), s["vace_patch_embedding.weight"][1]),
        lambda c: (c["num_attention_heads"] * c["attention_head_dim"], c["num_layers"], c["ffn_dim"],
                   len(c["vace_layers"]), c["vace_in_channels"]),
        lambda c: layouts.WAN_VACE_TRANSFORMER, takes=("wan_vae", "umt5"), experts=True),
    ComponentKind(
        "qwen_image_transformer", "denoiser", "qwen_image", ("img_in.weight", "txt_norm.weight"),
        "diffusers", "QwenImageTransformer2DModel",
        lambda s: (s["img_in.weight"][0], s["img_in.weight"][1], _count(s, r"transformer_blocks\.(\d+)\."),
                   s["txt_in.weight"][1]),
        lambda c: (c["num_attention_heads"] * c["attention_head_dim"], c["in_channels"], c["num_layers"],
                   c["joint_attention_dim"]),
        lambda c: layouts.QWEN_IMAGE_TRANSFORMER, quantized_prefix="transformer_blocks.",
        takes=("qwen_image_vae", "qwen25_vl"), gguf_architecture="qwen_image",
        flag_keys=(layouts.EDIT_2511_MARKER,)),
    ComponentKind(
        "wan_vae", "vae", "wan", ("decoder.middle.0.residual.0.gamma", "conv2.weight"),
        "diffusers", "AutoencoderKLWan",
        lambda s: (s["encoder.conv1.weight"][0], s["conv2.weight"][0], _count(s, r"decoder\.upsamples\.(\d+)\.")),
        lambda c: (c["base_dim"], c["z_dim"], _vae_flat_count(c)),
        layouts.vae_layout_for, quantized_prefix="\0"),
    # Wan2.2's VAE (TI2V-5B): 48 latent channels, 2x2-patchified input (12 channels), nested stages
    ComponentKind(
        "wan22_vae", "vae", "wan",
        ("decoder.middle.0.residual.0.gamma", "conv2.weight",
         "encoder.downsamples.0.downsamples.0.residual.0.gamma"),
        "diffusers", "AutoencoderKLWan",
        lambda s: (s["encoder.conv1.weight"][0], s["encoder.conv1.weight"][1], s["conv2.weight"][0],
                   _count(s, r"decoder\.upsamples\.(\d+)\.")),
        lambda c: (c["base_dim"], c["in_channels"], c["z_dim"], len(c["dim_mult"])),
        layouts.vae_layout_for, quantized_prefix="\0"),
    ComponentKind(
        "qwen_image_vae", "vae", "qwen_image", ("decoder.middle.0.residual.0.gamma", "conv2.weight"),
        "diffusers", "AutoencoderKLQwenImage",
        lambda s: (s["encoder.conv1.weight"][0], s["conv2.weight"][0], _count(s, r"decoder\.upsamples\.(\d+)\.")),
        lambda c: (c["base_dim"], c["z_dim"], _vae_flat_count(c)),
        layouts.vae_layout_for, quantized_prefix="\0", name_hint="qwen"),
    ComponentKind(
        "umt5", "text_encoder", "wan",
        ("shared.weight", "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"),
        "transformers", "UMT5EncoderModel",
        lambda s: (s["shared.weight"][1], _count(s, r"encoder\.block\.(\d+)\."), s["shared.weight"][0]),
        lambda c: (c["d_model"], c["num_layers"], c["vocab_size"]),
        lambda c: layouts.UMT5_ENCODER, quantized_prefix="encoder.block."),
    ComponentKind(
        "qwen25_vl", "text_encoder", "qwen_image",
        ("model.embed_tokens.weight", "model.layers.0.post_attention_layernorm.weight", "visual.patch_embed.proj.weight"),
        "transformers", "Qwen2_5_VLForConditionalGeneration",
        lambda s: (s["model.embed_tokens.weight"][1], _count(s, r"model\.layers\.(\d+)\."),
                   s["model.embed_tokens.weight"][0]),
        lambda c: (c["text_config"]["hidden_size"], c["text_config"]["num_hidden_layers"],
                   c["text_config"]["vocab_size"]),
        lambda c: layouts.QWEN25_VL_ENCODER, quantized_prefix="model.layers."),
    # Wan2.1 I2V's image encoder (ComfyUI's models/clip_vision, e.g. clip_vision_h): transformers' own names
    ComponentKind(
        "clip_vision", "image_encoder", "wan",
        ("vision_model.embeddings.patch_embedding.weight", "vision_model.post_layernorm.weight"),
        "transformers", "CLIPVisionModel",
        lambda s: (s["vision_model.post_layernorm.weight"][0], _count(s, r"vision_model\.encoder\.layers\.(\d+)\."),
                   s["vision_model.embeddings.patch_embedding.weight"][-1],
                   s["vision_model.embeddings.position_embedding.weight"][0]),
        lambda c: (c["hidden_size"], c["num_hidden_layers"], c["patch_size"],
                   (c["image_size"] // c["patch_size"]) ** 2 + 1),
        lambda c: layouts.CLIP_VISION_ENCODER, quantized_prefix="vision_model.encoder.layers."),
)}

KNOWN_MODELS = (
    KnownModel("wan2.1_t2v_1.3B", "wan_transformer", "Wan2.1 T2V 1.3B", "1.3B", "t2v"),
    KnownModel("wan_t2v_14B", "wan_transformer", "Wan T2V 14B", "14B", "t2v"),
    KnownModel("wan2.1_i2v_14B", "wan_transformer", "Wan2.1 I2V 14B", "14B", "i2v"),
    KnownModel("wan2.2_i2v_A14B", "wan_transformer", "Wan2.2 I2V A14B", "14B", "i2v"),
    KnownModel("wan2.2_ti2v_5B", "wan_transformer", "Wan2.2 TI2V 5B", "5B", "ti2v"),
    KnownModel("wan_transformer_tiny", "wan_transformer", "Wan T2V tiny", "tiny", "t2v"),
    KnownModel("wan_i2v_transformer_tiny", "wan_transformer", "Wan2.2 I2V tiny", "tiny", "i2v"),
    KnownModel("wan_i2v_clip_transformer_tiny", "wan_transformer", "Wan2.1 I2V tiny", "tiny", "i2v"),
    KnownModel("wan_ti2v_transformer_tiny", "wan_transformer", "Wan2.2 TI2V tiny", "tiny", "ti2v"),
    KnownModel("wan2.1_vace_1.3B", "wan_vace_transformer", "Wan2.1 VACE 1.3B", "1.3B", "vace"),
    KnownModel("wan2.1_vace_14B", "wan_vace_transformer", "Wan VACE 14B", "14B", "vace"),
    KnownModel("wan_vace_transformer_tiny", "wan_vace_transformer", "Wan VACE tiny", "tiny", "vace"),
    KnownModel("qwen_image", "qwen_image_transformer", "Qwen-Image", "20B"),
    KnownModel("qwen_image_transformer_tiny", "qwen_image_transformer", "Qwen-Image (lorabind tiny)", "tiny"),
    KnownModel("wan_2.1_vae", "wan_vae", "Wan2.1 VAE", "wan2.1"),
    KnownModel("wan_vae_tiny", "wan_vae", "Wan VAE (lorabind tiny)", "tiny"),
    KnownModel("wan2.2_vae", "wan22_vae", "Wan2.2 VAE", "wan2.2"),
    KnownModel("wan22_vae_tiny", "wan22_vae", "Wan2.2 VAE (lorabind tiny)", "tiny"),
    KnownModel("qwen_image_vae", "qwen_image_vae", "Qwen-Image VAE", "qwen_image"),
    KnownModel("qwen_image_vae_tiny", "qwen_image_vae", "Qwen-Image VAE (lorabind tiny)", "tiny"),
    KnownModel("qwen_image_edit_vae_tiny", "qwen_image_vae", "Qwen-Image VAE (lorabind tiny edit, 8x)", "tiny"),
    KnownModel("umt5_xxl", "umt5", "umt5-xxl", "xxl"),
    KnownModel("umt5_tiny", "umt5", "umt5 (lorabind tiny)", "tiny"),
    KnownModel("qwen25_vl_7b", "qwen25_vl", "Qwen2.5-VL 7B", "7B"),
    KnownModel("qwen25_vl_tiny", "qwen25_vl", "Qwen2.5-VL (lorabind tiny)", "tiny"),
    KnownModel("qwen25_vl_edit_tiny", "qwen25_vl", "Qwen2.5-VL with vision tokens (lorabind tiny edit)", "tiny"),
    KnownModel("clip_vision_h", "clip_vision", "CLIP ViT-H/14 vision", "h"),
    KnownModel("clip_vision_tiny", "clip_vision", "CLIP vision (lorabind tiny)", "tiny"),
)


@dataclass(frozen=True)
class RefusedKind:
    """Single files lorabind recognises (by marker keys) but does not load, with what to use instead."""
    title: str
    marker_sets: tuple[tuple[str, ...], ...]  # any set fully present: this kind (native names, diffusers names)
    instead: str

    def matches(self, shapes: dict) -> bool:
        return any(all(m in shapes for m in markers) for markers in self.marker_sets)


REFUSED_KINDS = (
    # native names as diffusers' MiniMax-H3 single-file converter reads them (layouts.MINIMAX_H3_TRANSFORMER), or
    # the diffusers names; the pipeline also needs the video VAE, the audio VAE and the Qwen3 text encoder, which
    # lorabind reads only from the diffusers folder.
    RefusedKind("MiniMax-H3 denoiser",
                (("video_patch_proj.weight", "audio_patch_proj.weight"),
                 ("proj_in.weight", "audio_proj_in.weight", "context_embedder.weight")),
                "MiniMax-H3 runs from its diffusers folder only (transformer, video and audio VAEs and text encoder "
                "together): put the folder under models/diffusers/ and load it with LoraBindModelLoader (\"Load "
                "Diffusers Model (lorabind)\")"),
)


@lru_cache(maxsize=None)
def config(name: str) -> dict:
    """A shipped config by name, or a ``.json`` file by path (the bench's generated models)."""
    path = Path(name) if name.endswith(".json") else CONFIG_DIR / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def model_class(kind: ComponentKind):
    import importlib

    return getattr(importlib.import_module(kind.library), kind.class_name)
