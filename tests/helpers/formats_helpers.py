"""Synthetic LoRA state dicts with the real published key names, sized for the tiny Wan / Qwen transformers.

Wan names follow LightX2V's distill LoRAs (native Wan module names, ``diffusion_model.`` prefix, ``.alpha``,
``.diff``, ``.diff_b``, ``.diff_m``); Qwen names follow Qwen-Image-Lightning (diffusers module names).
"""

from __future__ import annotations

import torch
from safetensors.torch import save_file

# tiny Wan transformer dims (conftest.build_tiny_wan)
WAN_DIM, WAN_FFN, WAN_TEXT, WAN_FREQ, WAN_IN, WAN_OUT, WAN_IMG = 24, 32, 32, 256, 16, 64, 20
# tiny Qwen-Image transformer dims (conftest.build_tiny_qwen)
QWEN_DIM, QWEN_FFN, QWEN_JOINT, QWEN_FREQ, QWEN_IN, QWEN_OUT = 48, 192, 16, 256, 16, 16


class _Writer:
    def __init__(self, seed: int, rank: int):
        self.g = torch.Generator().manual_seed(seed)
        self.rank = rank
        self.sd: dict = {}

    def rand(self, *shape, scale=0.1):
        return torch.randn(*shape, generator=self.g) * scale

    def pair(self, name, in_f, out_f, *, alpha=None, diff_b=False):
        self.sd[f"{name}.lora_down.weight"] = self.rand(self.rank, in_f)
        self.sd[f"{name}.lora_up.weight"] = self.rand(out_f, self.rank)
        if alpha is not None:
            self.sd[f"{name}.alpha"] = torch.tensor(float(alpha))
        if diff_b:
            self.sd[f"{name}.diff_b"] = self.rand(out_f, scale=0.01)


def wan_native_lora(*, num_blocks=2, rank=4, alpha=8.0, i2v=False, seed=0) -> dict:
    """Every tensor kind of a LightX2V Wan distill LoRA, native names, ``diffusion_model.`` prefix."""
    w = _Writer(seed, rank)
    d = WAN_DIM
    for i in range(num_blocks):
        b = f"diffusion_model.blocks.{i}"
        for attn in ("self_attn", "cross_attn"):
            for proj in ("q", "k", "v", "o"):
                w.pair(f"{b}.{attn}.{proj}", d, d, alpha=alpha, diff_b=True)
            w.sd[f"{b}.{attn}.norm_q.diff"] = w.rand(d, scale=0.01)
            w.sd[f"{b}.{attn}.norm_k.diff"] = w.rand(d, scale=0.01)
        if i2v:
            for proj in ("k_img", "v_img"):
                w.pair(f"{b}.cross_attn.{proj}", d, d, alpha=alpha, diff_b=True)
            w.sd[f"{b}.cross_attn.norm_k_img.diff"] = w.rand(d, scale=0.01)
        w.pair(f"{b}.ffn.0", d, WAN_FFN, alpha=alpha, diff_b=True)
        w.pair(f"{b}.ffn.2", WAN_FFN, d, alpha=alpha, diff_b=True)
        w.sd[f"{b}.norm3.diff"] = w.rand(d, scale=0.01)
        w.sd[f"{b}.norm3.diff_b"] = w.rand(d, scale=0.01)
        w.sd[f"{b}.diff_m"] = w.rand(1, 6, d, scale=0.01)
    w.sd["diffusion_model.blocks.0.self_attn.q.diff"] = w.rand(d, d, scale=0.01)  # full weight delta on a linear
    g = "diffusion_model"
    w.pair(f"{g}.head.head", d, WAN_OUT, alpha=alpha, diff_b=True)  # alpha on a non-block layer
    w.sd[f"{g}.head.diff_m"] = w.rand(1, 2, d, scale=0.01)  # head.modulation -> top-level scale_shift_table
    w.pair(f"{g}.text_embedding.0", WAN_TEXT, d, diff_b=True)
    w.pair(f"{g}.text_embedding.2", d, d, diff_b=True)
    w.pair(f"{g}.time_embedding.0", WAN_FREQ, d, diff_b=True)
    w.pair(f"{g}.time_embedding.2", d, d, diff_b=True)
    w.pair(f"{g}.time_projection.1", d, 6 * d, alpha=alpha, diff_b=True)
    # Conv3d patch embedding as a low-rank pair (down [r, in, 1, 2, 2], up [out, r, 1, 1, 1]) plus its bias
    w.sd[f"{g}.patch_embedding.lora_down.weight"] = w.rand(rank, WAN_IN, 1, 2, 2)
    w.sd[f"{g}.patch_embedding.lora_up.weight"] = w.rand(d, rank, 1, 1, 1)
    w.sd[f"{g}.patch_embedding.diff_b"] = w.rand(d, scale=0.01)
    if i2v:
        w.pair(f"{g}.img_emb.proj.1", WAN_IMG, WAN_IMG, diff_b=True)
        w.pair(f"{g}.img_emb.proj.3", WAN_IMG, d, diff_b=True)
        w.sd[f"{g}.img_emb.proj.0.diff"] = w.rand(WAN_IMG, scale=0.01)
        w.sd[f"{g}.img_emb.proj.0.diff_b"] = w.rand(WAN_IMG, scale=0.01)
        w.sd[f"{g}.img_emb.proj.4.diff"] = w.rand(d, scale=0.01)
    return w.sd


def qwen_lora(*, num_blocks=2, rank=4, alpha=None, seed=1) -> dict:
    """Qwen-Image-Lightning style: diffusers module names, ``lora_up``/``lora_down``, optional ``.alpha``."""
    w = _Writer(seed, rank)
    d = QWEN_DIM
    for i in range(num_blocks):
        b = f"transformer_blocks.{i}"
        for proj in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"):
            w.pair(f"{b}.attn.{proj}", d, d, alpha=alpha)
        for stream in ("img", "txt"):
            w.pair(f"{b}.{stream}_mod.1", d, 6 * d, alpha=alpha)
            w.pair(f"{b}.{stream}_mlp.net.0.proj", d, QWEN_FFN, alpha=alpha)
            w.pair(f"{b}.{stream}_mlp.net.2", QWEN_FFN, d, alpha=alpha)
    w.pair("img_in", QWEN_IN, d, alpha=alpha)
    w.pair("txt_in", QWEN_JOINT, d, alpha=alpha)
    w.pair("proj_out", d, QWEN_OUT, alpha=alpha)
    w.pair("norm_out.linear", d, 2 * d, alpha=alpha)
    w.pair("time_text_embed.timestep_embedder.linear_1", QWEN_FREQ, d, alpha=alpha)
    w.pair("time_text_embed.timestep_embedder.linear_2", d, d, alpha=alpha)
    return w.sd


def rename(sd: dict, *, prefix_from="", prefix_to="", suffixes=None, flatten=False) -> dict:
    """Re-spell a state dict in another layout: swap a prefix, the factor suffixes, or kohya-flatten the dots."""
    suffixes = suffixes or {}
    out = {}
    for key, value in sd.items():
        body = key[len(prefix_from):] if prefix_from and key.startswith(prefix_from) else key
        for old, new in suffixes.items():
            if body.endswith(old):
                body = body[: -len(old)] + new
                break
        if flatten:
            module, _, suffix = _split_suffix(body)
            body = module.replace(".", "_") + suffix
        out[prefix_to + body] = value
    return out


def _split_suffix(body: str):
    for suffix in (".lora_down.weight", ".lora_up.weight", ".alpha", ".diff_b", ".diff_m", ".diff"):
        if body.endswith(suffix):
            return body[: -len(suffix)], "", suffix
    raise ValueError(body)


def save(sd: dict, path, metadata=None) -> str:
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=metadata)
    return str(path)


def effective_deltas(targets: dict) -> dict:
    """{(module, param): full delta tensor} of canonical targets: scale·up@down (conv-aware) and every diff."""
    out = {}
    for module, patch in targets.items():
        if patch.low_rank is not None:
            lr = patch.low_rank
            product = lr.up.flatten(1).double() @ lr.down.flatten(1).double()
            out[(module, "weight_lowrank")] = (lr.scale * product).reshape(lr.up.shape[0], *lr.down.shape[1:])
        for param, diff in patch.param_diffs.items():
            out[(module, param)] = diff.double()
    return out
