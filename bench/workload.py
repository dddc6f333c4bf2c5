"""The bench workload: a synthetic Wan transformer and two lightx2v-layout LoRAs for it.

Full size is Wan2.1-1.3B width (dim 1536, ffn 8960, 12 heads, text_dim 4096) with 4 blocks in bf16; ``quick``
shrinks everything so the smoke test runs in seconds. Weights are random and built from a config: nothing is
downloaded.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

# native Wan module name -> (in_features, out_features) as a function of (dim, ffn)
_BLOCK_LINEARS = {
    "self_attn.q": lambda d, f: (d, d),
    "self_attn.k": lambda d, f: (d, d),
    "self_attn.v": lambda d, f: (d, d),
    "self_attn.o": lambda d, f: (d, d),
    "cross_attn.q": lambda d, f: (d, d),
    "cross_attn.k": lambda d, f: (d, d),
    "cross_attn.v": lambda d, f: (d, d),
    "cross_attn.o": lambda d, f: (d, d),
    "ffn.0": lambda d, f: (d, f),
    "ffn.2": lambda d, f: (f, d),
}


@dataclass(frozen=True)
class WorkloadSize:
    dim: int
    heads: int
    ffn: int
    text_dim: int
    layers: int
    rank: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


FULL = WorkloadSize(dim=1536, heads=12, ffn=8960, text_dim=4096, layers=4, rank=64)
QUICK = WorkloadSize(dim=96, heads=4, ffn=192, text_dim=64, layers=2, rank=8)


def wan_config(size: WorkloadSize) -> dict:
    """The ``WanTransformer3DModel`` config of the bench model at ``size`` (the transformer and the published-layout
    LoRA's shapes both come from it)."""
    return dict(patch_size=(1, 2, 2), num_attention_heads=size.heads, attention_head_dim=size.head_dim,
                in_channels=16, out_channels=16, text_dim=size.text_dim, freq_dim=256, ffn_dim=size.ffn,
                num_layers=size.layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads")


@contextlib.contextmanager
def building_in(dtype):
    """Modules built inside the block are built directly in ``dtype``: no float32 copy of the weights first."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_transformer(size: WorkloadSize, dtype=torch.bfloat16, seed: int = 0):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    with building_in(dtype):
        model = WanTransformer3DModel(**wan_config(size))
    return model.eval().requires_grad_(False)


def write_lora(path: str, size: WorkloadSize, seed: int, *, bias_diffs: bool = True) -> str:
    """A lightx2v-layout LoRA (``diffusion_model.`` native names, lora_down/up, .alpha, diff_b) for all block linears.

    ``bias_diffs=False`` leaves out ``diff_b``: a purely low-rank file, usable as a dynamic (peft) adapter."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for block in range(size.layers):
        for name, shape_of in _BLOCK_LINEARS.items():
            fin, fout = shape_of(size.dim, size.ffn)
            prefix = f"diffusion_model.blocks.{block}.{name}"
            tensors[f"{prefix}.lora_down.weight"] = (torch.randn(size.rank, fin, generator=g) * 0.01).to(torch.bfloat16)
            tensors[f"{prefix}.lora_up.weight"] = (torch.randn(fout, size.rank, generator=g) * 0.01).to(torch.bfloat16)
            tensors[f"{prefix}.alpha"] = torch.tensor(float(size.rank))
            if bias_diffs:
                tensors[f"{prefix}.diff_b"] = (torch.randn(fout, generator=g) * 0.001).to(torch.bfloat16)
    save_file(tensors, path)
    return path


def write_lora_pair(directory: str, size: WorkloadSize) -> tuple[str, str]:
    os.makedirs(directory, exist_ok=True)
    return (write_lora(os.path.join(directory, "bench_lora_a.safetensors"), size, seed=1),
            write_lora(os.path.join(directory, "bench_lora_b.safetensors"), size, seed=2))


def write_published_lora(path: str, size: WorkloadSize, seed: int) -> str:
    """The layout of lightx2v's published Wan2.1 distill LoRAs (reference §2.7), in bfloat16 as published, at
    ``size``'s rank with their alpha/rank ratio (8 at rank 64): every block's 10 linears (lora_down/lora_up/.alpha
    and ``diff_b``), the attention norms' ``.diff`` (norm_q/norm_k of both attentions), ``norm3`` diff/diff_b, the
    modulation's ``diff_m``, and the text/time embedding, time projection and head pairs. At Wan2.1-1.3B (30
    blocks): 1,428 tensors, 47 per block and 18 outside them. Written by ``tiny_models.lora_fixtures``' writer of
    this layout (one source of its keys and shapes); factors of the bench's magnitude."""
    from lorabind.tiny_models.lora_fixtures import wan_native_lora

    tensors = wan_native_lora(wan_config(size), seed, rank=size.rank, alpha=size.rank / 8, dtype=torch.bfloat16,
                              factor_std=0.01, diff_std=0.001)
    save_file(tensors, path)
    return path
