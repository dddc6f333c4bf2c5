"""The kinds of Wan single files lorabind loads (transformers, VACE transformers, the Wan2.1/2.2 VAEs, umt5 and the
CLIP vision encoder) and their published and tiny configurations, as data on Wan's layout.

Detection (``models/single_file/detect``) recognises a kind by its marker keys, then compares a shape signature
of the file with the same signature computed from each configuration of that kind.
"""

from __future__ import annotations

from ...io.single_file_kinds import ComponentKind, KnownModel, count_indices
from . import key_layouts
from .tokenizer import umt5_file_tokenizer


def vae_flat_count(config: dict) -> int:
    """The Wan-layout VAE decoder's flat ``upsamples`` count for a config (Qwen-Image's VAE counts alike)."""
    stages, resnets = len(config["dim_mult"]), int(config["num_res_blocks"]) + 1
    return stages * resnets + stages - 1


TRANSFORMER = ComponentKind(
    kind="wan_transformer", role="denoiser", markers=("head.modulation", "patch_embedding.weight"),
    library="diffusers", class_name="WanTransformer3DModel",
    file_signature=lambda s: (s["patch_embedding.weight"][0], s["patch_embedding.weight"][1],
                              count_indices(s, r"blocks\.(\d+)\."), s["blocks.0.ffn.0.weight"][0],
                              "img_emb.proj.1.weight" in s),
    config_signature=lambda c: (c["num_attention_heads"] * c["attention_head_dim"], c["in_channels"], c["num_layers"],
                                c["ffn_dim"], c.get("image_dim") is not None),
    layout=lambda c: key_layouts.WAN_TRANSFORMER, takes=("wan_vae", "wan22_vae", "umt5", "clip_vision"),
    experts=True, gguf_architecture="wan", excludes=("vace_patch_embedding.weight",))

KINDS = (
    TRANSFORMER,
    # Wan VACE (comfy/model_detection.py: ``vace_patch_embedding.weight`` present -> model_type "vace", with
    # ``vace_in_dim`` its input channels and ``vace_layers`` the number of ``vace_blocks``): Wan2.1 VACE 1.3B/14B,
    # and the Wan2.2 VACE Fun A14B experts, which have Wan2.1 VACE 14B's shapes (the name tells them apart)
    ComponentKind(
        kind="wan_vace_transformer", role="denoiser",
        markers=("head.modulation", "patch_embedding.weight", "vace_patch_embedding.weight"),
        library="diffusers", class_name="WanVACETransformer3DModel",
        file_signature=lambda s: (s["patch_embedding.weight"][0], count_indices(s, r"blocks\.(\d+)\."),
                                  s["blocks.0.ffn.0.weight"][0], count_indices(s, r"vace_blocks\.(\d+)\."),
                                  s["vace_patch_embedding.weight"][1]),
        config_signature=lambda c: (c["num_attention_heads"] * c["attention_head_dim"], c["num_layers"],
                                    c["ffn_dim"], len(c["vace_layers"]), c["vace_in_channels"]),
        layout=lambda c: key_layouts.WAN_VACE_TRANSFORMER, takes=("wan_vae", "umt5"), experts=True),
    ComponentKind(
        kind="wan_vae", role="vae", markers=("decoder.middle.0.residual.0.gamma", "conv2.weight"),
        library="diffusers", class_name="AutoencoderKLWan",
        file_signature=lambda s: (s["encoder.conv1.weight"][0], s["conv2.weight"][0],
                                  count_indices(s, r"decoder\.upsamples\.(\d+)\.")),
        config_signature=lambda c: (c["base_dim"], c["z_dim"], vae_flat_count(c)),
        layout=key_layouts.vae_layout_for, quantized_prefix="\0"),
    # Wan2.2's VAE (TI2V-5B): 48 latent channels, 2x2-patchified input (12 channels), nested stages
    ComponentKind(
        kind="wan22_vae", role="vae",
        markers=("decoder.middle.0.residual.0.gamma", "conv2.weight",
                 "encoder.downsamples.0.downsamples.0.residual.0.gamma"),
        library="diffusers", class_name="AutoencoderKLWan",
        file_signature=lambda s: (s["encoder.conv1.weight"][0], s["encoder.conv1.weight"][1], s["conv2.weight"][0],
                                  count_indices(s, r"decoder\.upsamples\.(\d+)\.")),
        config_signature=lambda c: (c["base_dim"], c["in_channels"], c["z_dim"], len(c["dim_mult"])),
        layout=key_layouts.vae_layout_for, quantized_prefix="\0"),
    ComponentKind(
        kind="umt5", role="text_encoder",
        markers=("shared.weight", "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"),
        library="transformers", class_name="UMT5EncoderModel",
        file_signature=lambda s: (s["shared.weight"][1], count_indices(s, r"encoder\.block\.(\d+)\."),
                                  s["shared.weight"][0]),
        config_signature=lambda c: (c["d_model"], c["num_layers"], c["vocab_size"]),
        layout=lambda c: key_layouts.UMT5_ENCODER, quantized_prefix="encoder.block.", tokenizer=umt5_file_tokenizer),
    # Wan2.1 I2V's image encoder (ComfyUI's models/clip_vision, e.g. clip_vision_h): transformers' own names
    ComponentKind(
        kind="clip_vision", role="image_encoder",
        markers=("vision_model.embeddings.patch_embedding.weight", "vision_model.post_layernorm.weight"),
        library="transformers", class_name="CLIPVisionModel",
        file_signature=lambda s: (s["vision_model.post_layernorm.weight"][0],
                                  count_indices(s, r"vision_model\.encoder\.layers\.(\d+)\."),
                                  s["vision_model.embeddings.patch_embedding.weight"][-1],
                                  s["vision_model.embeddings.position_embedding.weight"][0]),
        config_signature=lambda c: (c["hidden_size"], c["num_hidden_layers"], c["patch_size"],
                                    (c["image_size"] // c["patch_size"]) ** 2 + 1),
        layout=lambda c: key_layouts.CLIP_VISION_ENCODER, quantized_prefix="vision_model.encoder.layers."),
)


def _known(config: str, kind: str, title: str, size: str, variant=None) -> KnownModel:
    return KnownModel(config=config, kind=kind, title=title, size=size, variant=variant)


KNOWN_MODELS = tuple(_known(*row) for row in (
    ("wan2.1_t2v_1.3B", "wan_transformer", "Wan2.1 T2V 1.3B", "1.3B", "t2v"),
    ("wan_t2v_14B", "wan_transformer", "Wan T2V 14B", "14B", "t2v"),
    ("wan2.1_i2v_14B", "wan_transformer", "Wan2.1 I2V 14B", "14B", "i2v"),
    ("wan2.2_i2v_A14B", "wan_transformer", "Wan2.2 I2V A14B", "14B", "i2v"),
    ("wan2.2_ti2v_5B", "wan_transformer", "Wan2.2 TI2V 5B", "5B", "ti2v"),
    ("wan_transformer_tiny", "wan_transformer", "Wan T2V tiny", "tiny", "t2v"),
    ("wan_i2v_transformer_tiny", "wan_transformer", "Wan2.2 I2V tiny", "tiny", "i2v"),
    ("wan_i2v_clip_transformer_tiny", "wan_transformer", "Wan2.1 I2V tiny", "tiny", "i2v"),
    ("wan_ti2v_transformer_tiny", "wan_transformer", "Wan2.2 TI2V tiny", "tiny", "ti2v"),
    ("wan2.1_vace_1.3B", "wan_vace_transformer", "Wan2.1 VACE 1.3B", "1.3B", "vace"),
    ("wan2.1_vace_14B", "wan_vace_transformer", "Wan VACE 14B", "14B", "vace"),
    ("wan_vace_transformer_tiny", "wan_vace_transformer", "Wan VACE tiny", "tiny", "vace"),
    ("wan_2.1_vae", "wan_vae", "Wan2.1 VAE", "wan2.1"),
    ("wan_vae_tiny", "wan_vae", "Wan VAE (lorabind tiny)", "tiny"),
    ("wan2.2_vae", "wan22_vae", "Wan2.2 VAE", "wan2.2"),
    ("wan22_vae_tiny", "wan22_vae", "Wan2.2 VAE (lorabind tiny)", "tiny"),
    ("umt5_xxl", "umt5", "umt5-xxl", "xxl"),
    ("umt5_tiny", "umt5", "umt5 (lorabind tiny)", "tiny"),
    ("clip_vision_h", "clip_vision", "CLIP ViT-H/14 vision", "h"),
    ("clip_vision_tiny", "clip_vision", "CLIP vision (lorabind tiny)", "tiny"),
))
