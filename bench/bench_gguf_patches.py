"""LoRA on GGUF: the per-step cost of a patched GGUF layer (issue 27), beside the unpatched GGUF layer and a
fused bf16 layer.

One Wan FFN up-projection (``ffn.0``: dim -> ffn) three ways, in one process, timed round-robin (median after a
warm-up), all computing in bf16 on the same tokens:

* ``gguf``: diffusers' ``GGUFLinear`` over Q8_0 bytes (dequantise, cast, matmul);
* ``gguf_patched``: the same layer with a rank-r LoRA bound through the patcher (``binding.dequant_patches``:
  dequantise in fp32, add ``s·up@down``, cast once, matmul);
* ``bf16_fused``: a plain bf16 ``nn.Linear`` with the same LoRA fused into its weight (what the bf16 path runs).

The ratios are per forward of one layer: a step is the same forward for every linear of the model, so they are
the per-step ratios of a model whose linears are all patched. The patched layer pays a float32 dequantise (where
diffusers' own runs in float16) and one ``out x r x in`` product per forward, whatever the token count; a fused
bf16 layer pays nothing at run time (its cost is at bind). A dynamic (peft) adapter over the GGUF layer instead
pays ``tokens x r x (in + out)``: cheaper for short sequences, it is the choice for a kind with a peft form.
"""

from __future__ import annotations

import statistics

import torch

from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.lora.canonical import LowRankDelta, TargetPatch

from .measure import timed
from .workload import QUICK

# tokens per forward: fewer than one 480p Wan latent frame (30 x 52 = 1560) at the full size, so the fixed
# per-forward cost of the patch (dequantise + one rank-r product) weighs more here than in a real run
TOKENS = {"quick": 32, "full": 1024}


def _gguf_layer(weight: torch.Tensor):
    import gguf
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter

    quant_type = gguf.GGMLQuantizationType.Q8_0
    layer = GGUFLinear(weight.shape[1], weight.shape[0], False, compute_dtype=torch.bfloat16)
    data = gguf.quants.quantize(weight.float().numpy(), quant_type)
    layer.weight = GGUFParameter(torch.from_numpy(data), quant_type=quant_type)
    return layer.requires_grad_(False)


def _bound(layer: torch.nn.Module, delta: LowRankDelta) -> WeightPatcher:
    patcher = WeightPatcher({"layer": layer})
    patcher.apply([PatchLayer("bench", "layer", 1.0, {"": TargetPatch(module="", low_rank=delta)})])
    return patcher


def run(size, reps: int) -> dict:
    """{"gguf_ms", "gguf_patched_ms", "bf16_fused_ms", and the two ratios} for one layer of ``size``."""
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(size.ffn, size.dim, generator=generator) * 0.02
    delta = LowRankDelta(down=torch.randn(size.rank, size.dim, generator=generator) * 0.01,
                         up=torch.randn(size.ffn, size.rank, generator=generator) * 0.01, alpha=None, scale=1.0)
    plain, patched = _gguf_layer(weight), _gguf_layer(weight)
    fused = torch.nn.Linear(size.dim, size.ffn, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        fused.weight.copy_(weight)
    _bound(patched, delta), _bound(fused, delta)
    tokens = TOKENS["quick" if size is QUICK else "full"]
    x = torch.randn(1, tokens, size.dim, generator=generator).bfloat16()
    layers = {"gguf": plain, "gguf_patched": patched, "bf16_fused": fused}
    times: dict = {name: [] for name in layers}
    with torch.no_grad():
        for rep in range(reps + 1):
            for name, layer in layers.items():
                elapsed = timed(lambda layer=layer: layer(x))
                if rep:  # the first round warms up
                    times[name].append(elapsed)
    ms = {f"{name}_ms": statistics.median(values) * 1000 for name, values in times.items()}
    return {**ms, "tokens": tokens, "layer": f"{size.dim}->{size.ffn} Q8_0, rank {size.rank}",
            "gguf_patched_vs_gguf": ms["gguf_patched_ms"] / ms["gguf_ms"],
            "gguf_patched_vs_bf16_fused": ms["gguf_patched_ms"] / ms["bf16_fused_ms"]}
