"""Native single-file key layouts as data: each component's diffusers names <-> the names in the files ComfyUI
users have (``models/diffusion_models``, ``vae``, ``text_encoders``).

Each rule pairs a diffusers module path with the native one; ``{i}`` / ``{j}`` stand for block indices, and the
rest of the key (``.weight``, ``.bias``, ``.gamma``) is carried over. Rules are tried in order and the first
full match wins; keys no rule names are the same in both layouts. The rules are the inverse of diffusers' own
single-file converters (``diffusers/loaders/single_file_utils.py`` 0.42: ``convert_wan_transformer_to_diffusers``,
``convert_wan_vae_to_diffusers``, the identity mapping for ``QwenImageTransformer2DModel``,
``convert_minimax_h3_transformer_checkpoint_to_diffusers``) and of ComfyUI's text-encoder files
(``comfy/text_encoders/t5.py``: the HF T5 names plus a ``spiece_model`` uint8 tensor; ``llama.py``
``Qwen25_7BVLI``: the original Qwen2.5-VL checkpoint names ``model.layers.N...`` / ``visual.blocks.N...``).
The tests check them against diffusers' converters on real-structured models.

The Wan VAE's decoder is numbered flat in the native layout (``decoder.upsamples.N``) but nested in diffusers
(``up_blocks.i.resnets.j`` / ``upsamplers.0``), so its rules are generated from the VAE config (stage count and
``num_res_blocks``) instead of the fixed indices diffusers' converter assumes (the real models' 4 stages x 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ...families.qwen_image.single_files import EDIT_2511_MARKER

# prefixes some single files carry in front of every key (ComfyUI strips them too)
DIFFUSION_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def _template_regex(template: str) -> re.Pattern:
    pattern = re.escape(template)
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", pattern)
    return re.compile(rf"{pattern}(?P<_rest>\..+)?")


@dataclass(frozen=True)
class Fused:
    """One native tensor (``native`` template) that is several diffusers tensors (``parts`` templates)
    concatenated along dim 0 (MiniMax-H3 ``qkv_proj``), or one diffusers tensor with its two halves swapped
    (``swap_halves``: MiniMax-H3 files store SwiGLU's ``[gate; value]``, diffusers reads ``[value; gate]``)."""
    native: str
    parts: tuple[str, ...]
    swap_halves: bool = False


@dataclass
class KeyLayout:
    """The bidirectional key mapping of one component kind."""
    name: str
    rules: tuple[tuple[str, str], ...]  # (diffusers template, native template)
    fused: tuple[Fused, ...] = ()
    native_only: tuple[str, ...] = ()  # native keys diffusers recomputes (dropped on load)
    diffusers_only: tuple[str, ...] = ()  # diffusers keys that are tied copies (not written)
    _compiled: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        self._compiled = [(_template_regex(d), d, _template_regex(n), n) for d, n in self.rules]

    @staticmethod
    def _rewrite(key: str, pairs) -> Optional[str]:
        for regex, target in pairs:
            match = regex.fullmatch(key)
            if match:
                groups = {k: v for k, v in match.groupdict().items() if k != "_rest"}
                return target.format(**groups) + (match["_rest"] or "")
        return None

    def to_native(self, key: str) -> str:
        renamed = self._rewrite(key, [(d, n) for d, _, _, n in self._compiled])
        return key if renamed is None else renamed

    def to_diffusers(self, key: str) -> str:
        renamed = self._rewrite(key, [(n, d) for _, d, n, _ in self._compiled])
        return key if renamed is None else renamed

    def native_plan(self, diffusers_keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """native key -> the diffusers keys it holds (one, or a fused rule's parts in order)."""
        keys = [k for k in diffusers_keys if k not in self.diffusers_only]
        plan: dict[str, tuple[str, ...]] = {}
        claimed: set[str] = set()
        for rule in self.fused:
            first = _template_regex(rule.parts[0])
            for key in keys:
                match = first.fullmatch(key)
                if match:
                    groups = {k: v for k, v in match.groupdict().items() if k != "_rest"}
                    rest = match["_rest"] or ""
                    parts = tuple(p.format(**groups) + rest for p in rule.parts)
                    plan[rule.native.format(**groups) + rest] = parts
                    claimed.update(parts)
        for key in keys:
            if key not in claimed:
                plan[self.to_native(key)] = (key,)
        return plan

    def fused_rule(self, native_key: str) -> Optional[Fused]:
        for rule in self.fused:
            if _template_regex(rule.native).fullmatch(native_key):
                return rule
        return None

    def split(self, native_key: str, tensor, diffusers_keys: tuple[str, ...]) -> dict:
        """The diffusers tensors one native tensor holds (the inverse of ``join``)."""
        import torch

        rule = self.fused_rule(native_key)
        if rule is None:
            return {diffusers_keys[0]: tensor}
        if rule.swap_halves:
            first, second = tensor.chunk(2, dim=0)
            return {diffusers_keys[0]: torch.cat([second, first], dim=0)}
        return dict(zip(diffusers_keys, tensor.chunk(len(diffusers_keys), dim=0)))

    def join(self, native_key: str, tensors: list):
        """One native tensor from its diffusers parts (``native_plan`` order)."""
        import torch

        rule = self.fused_rule(native_key)
        if rule is not None and rule.swap_halves:
            first, second = tensors[0].chunk(2, dim=0)
            return torch.cat([second, first], dim=0)
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)


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

# QwenImageTransformer2DModel's single files use the diffusers names (diffusers maps them with identity).
# ComfyUI's Qwen-Image-Edit-2511 files also carry an empty marker tensor (``EDIT_2511_MARKER``, what the Qwen-Image
# family reads the edition from); it holds no weight.
QWEN_IMAGE_TRANSFORMER = KeyLayout("qwen_image_transformer", (), native_only=(EDIT_2511_MARKER,))

MINIMAX_H3_TRANSFORMER = KeyLayout("minimax_h3_transformer", (
    ("transformer_blocks.{i}.attn.norm_q", "blocks.{i}.attn.q_norm"),
    ("transformer_blocks.{i}.attn.norm_k", "blocks.{i}.attn.k_norm"),
    ("transformer_blocks.{i}.attn.to_out.0", "blocks.{i}.attn.out_proj"),
    ("transformer_blocks.{i}.ff.net.0.proj", "blocks.{i}.mlp.fc1"),
    ("transformer_blocks.{i}.ff.net.2", "blocks.{i}.mlp.fc2"),
    ("transformer_blocks", "blocks"),
    ("token_refiner.refiner_blocks.{i}.attn.norm_q", "token_refiner.blocks.{i}.attn.q_norm"),
    ("token_refiner.refiner_blocks.{i}.attn.norm_k", "token_refiner.blocks.{i}.attn.k_norm"),
    ("token_refiner.refiner_blocks.{i}.attn.to_out.0", "token_refiner.blocks.{i}.attn.out_proj"),
    ("token_refiner.refiner_blocks.{i}.ff.net.0.proj", "token_refiner.blocks.{i}.mlp.fc1"),
    ("token_refiner.refiner_blocks.{i}.ff.net.2", "token_refiner.blocks.{i}.mlp.fc2"),
    ("token_refiner.refiner_blocks", "token_refiner.blocks"),
    ("time_embedder.linear_1", "time_embedder.proj_in"),
    ("time_embedder.linear_2", "time_embedder.proj_out"),
    ("proj_in", "video_patch_proj"),
    ("audio_proj_in", "audio_patch_proj"),
    ("context_embedder", "condition_proj"),
    ("norm_out.norm", "final_layer.norm"),
    ("norm_out.linear", "final_layer.adaln_proj.linear"),
    ("proj_out", "final_layer.video_out"),
    ("audio_proj_out", "final_layer.audio_out"),
), fused=(
    *(Fused(f"{native}.{{i}}.attn.qkv_proj", tuple(f"{ours}.{{i}}.attn.to_{p}" for p in "qkv"))
      for ours, native in (("transformer_blocks", "blocks"), ("token_refiner.refiner_blocks", "token_refiner.blocks"))),
    *(Fused(f"{native}.{{i}}.mlp.fc1", (f"{ours}.{{i}}.ff.net.0.proj",), swap_halves=True)
      for ours, native in (("transformer_blocks", "blocks"), ("token_refiner.refiner_blocks", "token_refiner.blocks"))),
), native_only=("rope.inv_freq",))

# transformers' UMT5EncoderModel uses the HF T5 names ComfyUI's files keep; ``encoder.embed_tokens`` is tied to
# ``shared`` and not in the files.
UMT5_ENCODER = KeyLayout("umt5_encoder", (), diffusers_only=("encoder.embed_tokens.weight",))
SPIECE_KEY = "spiece_model"

# transformers >= 4.52 nests the language model and the vision tower under ``model.``; the files keep the
# original checkpoint names.
QWEN25_VL_ENCODER = KeyLayout("qwen25_vl_encoder", (
    ("model.language_model", "model"),
    ("model.visual", "visual"),
))

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


def strip_prefix(key: str) -> str:
    for prefix in DIFFUSION_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key
