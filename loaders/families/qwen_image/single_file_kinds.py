"""The kinds of Qwen-Image single files lorabind loads (the transformer, the VAE and the Qwen2.5-VL text encoder)
and their published and tiny configurations, as data on Qwen-Image's layout."""

from __future__ import annotations

from ...io.single_file_kinds import ComponentKind, KnownModel, count_indices
from ..wan.key_layouts import vae_layout_for
from ..wan.single_file_kinds import vae_flat_count
from . import key_layouts
from .single_files import EDIT_2511_MARKER
from .tokenizer import qwen25_file_tokenizer

KINDS = (
    ComponentKind(
        kind="qwen_image_transformer", role="denoiser", markers=("img_in.weight", "txt_norm.weight"),
        library="diffusers", class_name="QwenImageTransformer2DModel",
        file_signature=lambda s: (s["img_in.weight"][0], s["img_in.weight"][1],
                                  count_indices(s, r"transformer_blocks\.(\d+)\."), s["txt_in.weight"][1]),
        config_signature=lambda c: (c["num_attention_heads"] * c["attention_head_dim"], c["in_channels"],
                                    c["num_layers"], c["joint_attention_dim"]),
        layout=lambda c: key_layouts.QWEN_IMAGE_TRANSFORMER, quantized_prefix="transformer_blocks.",
        takes=("qwen_image_vae", "qwen25_vl"), gguf_architecture="qwen_image", flag_keys=(EDIT_2511_MARKER,)),
    # the Wan VAE's network and key names: the file name tells them apart ("qwen" in it, as ComfyUI's names do)
    ComponentKind(
        kind="qwen_image_vae", role="vae", markers=("decoder.middle.0.residual.0.gamma", "conv2.weight"),
        library="diffusers", class_name="AutoencoderKLQwenImage",
        file_signature=lambda s: (s["encoder.conv1.weight"][0], s["conv2.weight"][0],
                                  count_indices(s, r"decoder\.upsamples\.(\d+)\.")),
        config_signature=lambda c: (c["base_dim"], c["z_dim"], vae_flat_count(c)),
        layout=vae_layout_for, quantized_prefix="\0", name_hint="qwen"),
    ComponentKind(
        kind="qwen25_vl", role="text_encoder",
        markers=("model.embed_tokens.weight", "model.layers.0.post_attention_layernorm.weight",
                 "visual.patch_embed.proj.weight"),
        library="transformers", class_name="Qwen2_5_VLForConditionalGeneration",
        file_signature=lambda s: (s["model.embed_tokens.weight"][1], count_indices(s, r"model\.layers\.(\d+)\."),
                                  s["model.embed_tokens.weight"][0]),
        config_signature=lambda c: (c["text_config"]["hidden_size"], c["text_config"]["num_hidden_layers"],
                                    c["text_config"]["vocab_size"]),
        layout=lambda c: key_layouts.QWEN25_VL_ENCODER, quantized_prefix="model.layers.",
        # text encoding never uses the language-model head, so files may leave it out
        tokenizer=qwen25_file_tokenizer, tied_to_embeddings=("lm_head.weight",)),
)

KNOWN_MODELS = tuple(KnownModel(config=config, kind=kind, title=title, size=size) for config, kind, title, size in (
    ("qwen_image", "qwen_image_transformer", "Qwen-Image", "20B"),
    ("qwen_image_transformer_tiny", "qwen_image_transformer", "Qwen-Image (lorabind tiny)", "tiny"),
    ("qwen_image_vae", "qwen_image_vae", "Qwen-Image VAE", "qwen_image"),
    ("qwen_image_vae_tiny", "qwen_image_vae", "Qwen-Image VAE (lorabind tiny)", "tiny"),
    ("qwen_image_edit_vae_tiny", "qwen_image_vae", "Qwen-Image VAE (lorabind tiny edit, 8x)", "tiny"),
    ("qwen25_vl_7b", "qwen25_vl", "Qwen2.5-VL 7B", "7B"),
    ("qwen25_vl_tiny", "qwen25_vl", "Qwen2.5-VL (lorabind tiny)", "tiny"),
    ("qwen25_vl_edit_tiny", "qwen25_vl", "Qwen2.5-VL with vision tokens (lorabind tiny edit)", "tiny"),
))
