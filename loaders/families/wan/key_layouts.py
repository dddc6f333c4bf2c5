"""Wan's native single-file key layouts: its transformers (and VACE's), VAEs, the umt5 text encoder and the CLIP
vision encoder, each the inverse of diffusers' own converters (``diffusers/loaders/single_file_utils.py`` 0.42:
``convert_wan_transformer_to_diffusers``, ``convert_wan_vae_to_diffusers``) or of ComfyUI's text-encoder files
(``comfy/text_encoders/t5.py``: the HF T5 names plus a ``spiece_model`` uint8 tensor). The tests check them
against diffusers' converters on real-structured models.

The Wan VAE's decoder is numbered flat in the native layout (``decoder.upsamples.N``) but nested in diffusers
(``up_blocks.i.resnets.j`` / ``upsamplers.0``), so its rules are generated from the VAE config (stage count and
``num_res_blocks``) instead of the fixed indices diffusers' converter assumes (the real models' 4 stages x 3).
"""

from __future__ import annotations

from ...io.key_layouts import KeyLayout

_WAN_ATTN = tuple(
    (f"blocks.{{i}}.{d_attn}.{d_proj}", f"blocks.{{i}}.{n_attn}.{n_proj}")
    for d_attn, n_attn in (("attn1", "self_attn"), ("attn2", "cross_attn"))
    for d_proj, n_proj in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "o"),
                           ("norm_q", "norm_q"), ("norm_k", "norm_k"))
)

WAN_TRANSFORMER = KeyLayout("wan_transformer", _WAN_ATTN + (
    ("blocks.{i}.attn2.add_k_proj", "blocks.{i}.cross_attn.k_img"),
    ("blocks.{i}.attn2.add_v_proj", "blocks.{i}.cross_attn.v_img"),
    ("blocks.{i}.attn2.norm_added_k", "blocks.{i}.cross_attn.norm_k_img"),
    ("blocks.{i}.ffn.net.0.proj", "blocks.{i}.ffn.0"),
    ("blocks.{i}.ffn.net.2", "blocks.{i}.ffn.2"),
    ("blocks.{i}.norm2", "blocks.{i}.norm3"),  # the affine cross-attention norm; native norm2 has no params
    ("blocks.{i}.scale_shift_table", "blocks.{i}.modulation"),
    ("scale_shift_table", "head.modulation"),
    ("proj_out", "head.head"),
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("condition_embedder.image_embedder.norm1", "img_emb.proj.0"),
    ("condition_embedder.image_embedder.ff.net.0.proj", "img_emb.proj.1"),
    ("condition_embedder.image_embedder.ff.net.2", "img_emb.proj.3"),
    ("condition_embedder.image_embedder.norm2", "img_emb.proj.4"),
    ("condition_embedder.image_embedder.pos_embed", "img_emb.emb_pos"),
))

# Wan VACE (``WanVACETransformer3DModel``): the Wan transformer plus ``vace_blocks.N``, each a main block's modules
# under the same names and its own input (block 0 only) and output projections, which ComfyUI's layout calls
# ``before_proj`` / ``after_proj`` (``comfy/ldm/wan/model.py``: ``VaceWanAttentionBlock``; diffusers' converter
# maps them to ``proj_in`` / ``proj_out``). ``vace_patch_embedding`` has one name in both.
_VACE_BLOCK_RULES = tuple((d.replace("blocks.{i}", "vace_blocks.{i}", 1), n.replace("blocks.{i}", "vace_blocks.{i}", 1))
                          for d, n in WAN_TRANSFORMER.rules if d.startswith("blocks.{i}."))
WAN_VACE_TRANSFORMER = KeyLayout("wan_vace_transformer", WAN_TRANSFORMER.rules + _VACE_BLOCK_RULES + (
    ("vace_blocks.{i}.proj_in", "vace_blocks.{i}.before_proj"),
    ("vace_blocks.{i}.proj_out", "vace_blocks.{i}.after_proj"),
))

# transformers' UMT5EncoderModel uses the HF T5 names ComfyUI's files keep; ``encoder.embed_tokens`` is tied to
# ``shared`` and not in the files.
UMT5_ENCODER = KeyLayout("umt5_encoder", (), diffusers_only=("encoder.embed_tokens.weight",))
SPIECE_KEY = "spiece_model"

# ComfyUI's clip_vision files (clip_vision_h) keep the HF checkpoint names ``vision_model.*``; transformers 5's
# CLIPVisionModel names its parameters without that prefix (4.x with it: no rule matches then, names are equal).
# The projection head (and a stored position_ids buffer, when present) are not part of the vision tower Wan2.1
# I2V runs.
CLIP_VISION_ENCODER = KeyLayout("clip_vision_encoder", tuple(
    (part, f"vision_model.{part}") for part in ("embeddings", "encoder", "pre_layrnorm", "post_layernorm")),
    native_only=("visual_projection.weight", "vision_model.embeddings.position_ids"))

_RESNET = (("norm1", "residual.0"), ("conv1", "residual.2"), ("norm2", "residual.3"), ("conv2", "residual.6"),
           ("conv_shortcut", "shortcut"))


def _resnet_rules(diffusers_prefix: str, native_prefix: str) -> tuple:
    return tuple((f"{diffusers_prefix}.{d}", f"{native_prefix}.{n}") for d, n in _RESNET)


def _wan_vae_outer_rules() -> list:
    """What the Wan2.1 and Wan2.2 VAEs name alike: input/output convolutions, quant convolutions, middle, head."""
    rules = [("encoder.conv_in", "encoder.conv1"), ("decoder.conv_in", "decoder.conv1"),
             ("quant_conv", "conv1"), ("post_quant_conv", "conv2")]
    for side in ("encoder", "decoder"):
        rules += _resnet_rules(f"{side}.mid_block.resnets.0", f"{side}.middle.0")
        rules += [(f"{side}.mid_block.attentions.0", f"{side}.middle.1")]
        rules += _resnet_rules(f"{side}.mid_block.resnets.1", f"{side}.middle.2")
        rules += [(f"{side}.norm_out", f"{side}.head.0"), (f"{side}.conv_out", f"{side}.head.2")]
    return rules


def wan_vae_layout(num_stages: int, num_res_blocks: int) -> KeyLayout:
    """The Wan 2.1 VAE layout (also Qwen-Image's VAE, the same network) for a config's stage count."""
    rules = _wan_vae_outer_rules()
    rules += _resnet_rules("encoder.down_blocks.{i}", "encoder.downsamples.{i}")  # flat in both layouts
    flat = 0
    for stage in range(num_stages):
        for resnet in range(num_res_blocks + 1):
            rules += _resnet_rules(f"decoder.up_blocks.{stage}.resnets.{resnet}", f"decoder.upsamples.{flat}")
            flat += 1
        if stage != num_stages - 1:
            rules.append((f"decoder.up_blocks.{stage}.upsamplers.0", f"decoder.upsamples.{flat}"))
            flat += 1
    return KeyLayout(f"wan_vae_{num_stages}x{num_res_blocks}", tuple(rules))


def wan22_vae_layout(num_stages: int, num_res_blocks: int) -> KeyLayout:
    """The Wan2.2 VAE layout (``is_residual``: TI2V-5B's ``wan2.2_vae``), the inverse of diffusers'
    ``scripts/convert_wan_to_diffusers.py`` ``convert_vae_22`` (0.42; the library's ``from_single_file`` has no
    converter for it). Each stage nests its blocks: ``encoder.downsamples.{i}.downsamples.{j}`` are the stage's
    ``num_res_blocks`` resnets, then its downsampler; the decoder's stages hold ``num_res_blocks + 1`` resnets,
    then the upsampler. The head, middle and quant convolutions are named as in Wan2.1's VAE."""
    rules = _wan_vae_outer_rules()
    rules += _resnet_rules("encoder.down_blocks.{i}.resnets.{j}", "encoder.downsamples.{i}.downsamples.{j}")
    rules += [("encoder.down_blocks.{i}.downsampler", f"encoder.downsamples.{{i}}.downsamples.{num_res_blocks}")]
    rules += _resnet_rules("decoder.up_blocks.{i}.resnets.{j}", "decoder.upsamples.{i}.upsamples.{j}")
    rules += [("decoder.up_blocks.{i}.upsampler", f"decoder.upsamples.{{i}}.upsamples.{num_res_blocks + 1}")]
    return KeyLayout(f"wan22_vae_{num_stages}x{num_res_blocks}", tuple(rules))


def vae_layout_for(config: dict) -> KeyLayout:
    """The Wan-style VAE layout of a config: Wan2.2's nested one for a residual VAE, else Wan2.1's flat one."""
    if config.get("is_residual"):
        return wan22_vae_layout(len(config["dim_mult"]), int(config["num_res_blocks"]))
    return wan_vae_layout(len(config["dim_mult"]), int(config["num_res_blocks"]))
