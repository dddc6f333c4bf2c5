"""Text encoding of a 20-token prompt at UMT5-XXL's real width: diffusers' ``WanPipeline.encode_prompt`` (512
positions, pads masked, then zeroed) against lorabind's ``encode_text`` (the real tokens, then zero rows).

The encoder is built from UMT5-XXL's published config (d_model 4096, 64 heads of 64, d_ff 10240, gated-gelu,
32 relative buckets up to distance 128) with random bf16 weights at bench time; nothing is downloaded. Two of its
24 layers (``LAYERS``), and the bench tokenizer's small vocabulary instead of 256,384 entries: both sides do the
same work per layer, so the ratio does not depend on the depth, and an embedding lookup's cost does not depend on
the vocabulary; the full depth would hold 11 GB and take minutes per padded encode on this CPU.
Metric: ``text_encode_20_tokens_vs_diffusers`` (diffusers seconds / lorabind seconds).
"""

from __future__ import annotations

import torch

from lorabind.loaders.dispatch.generation_steps import encode_text
from lorabind.loaders.models.store import LoadedModel
from lorabind.tiny_models.tokenizers import build_umt5_style_tokenizer

from .measure import alternate_balanced, timed
from .workload import building_in

UMT5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_heads=64, relative_attention_num_buckets=32,
                relative_attention_max_distance=128, feed_forward_proj="gated-gelu", dropout_rate=0.0)
LAYERS = 2
QUICK_WIDTH = dict(d_model=64, d_kv=16, d_ff=128, num_heads=4)
PROMPT_TOKENS = 20  # the end token included
WAN_TEXT_TOKENS = 512  # what WanPipeline.__call__ asks encode_prompt for
WORDS = "a red car on the street and a cat dancing with the dog in the video of a monkey low quality image".split()


def build_umt5(vocab_size: int, **config):
    """A UMT5 encoder of ``UMT5Config(**config)`` with random bf16 weights (the end-to-end bench's small one too)."""
    from transformers import UMT5Config, UMT5EncoderModel

    with building_in(torch.bfloat16):
        return UMT5EncoderModel(UMT5Config(vocab_size=vocab_size, **config)).eval().requires_grad_(False)


def build_encoder(vocab_size: int, quick: bool):
    torch.manual_seed(0)
    return build_umt5(vocab_size, num_layers=LAYERS, **{**UMT5_XXL, **(QUICK_WIDTH if quick else {})})


def prompt_of(tokenizer, tokens: int) -> str:
    """A prompt of exactly ``tokens`` tokens for ``tokenizer`` (one token per word, plus the end token)."""
    text = " ".join(WORDS[: tokens - 1])
    count = len(tokenizer(text).input_ids)
    if count != tokens:
        raise RuntimeError(f"bench prompt has {count} tokens, not {tokens}")
    return text


def run(quick: bool, reps: int) -> dict:
    from diffusers import WanPipeline

    tokenizer = build_umt5_style_tokenizer()
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=build_encoder(len(tokenizer), quick), transformer=None,
                           vae=None, scheduler=None)
    model = LoadedModel(path="umt5-xxl-width-random", name="umt5-xxl-width-random", family="wan2.1",
                        pipeline=pipeline)
    text = prompt_of(tokenizer, PROMPT_TOKENS)
    results = {}

    def diffusers_side():
        with torch.no_grad():
            results["diffusers"] = pipeline.encode_prompt(prompt=text, do_classifier_free_guidance=False,
                                                          max_sequence_length=WAN_TEXT_TOKENS, device="cpu")[0]

    def lorabind_side():
        results["lorabind"] = encode_text(model, text).embeds

    pair = alternate_balanced("diffusers encode_prompt (512 positions)", lambda: timed(diffusers_side),
                              "lorabind encode_text (20 real tokens)", lambda: timed(lorabind_side), reps)
    reference, ours = results["diffusers"].float(), results["lorabind"]
    return {"pair": pair, "text_encode_20_tokens_vs_diffusers": pair.ratio, "layers": LAYERS,
            "width": pipeline.text_encoder.config.d_model,
            "max_abs_difference": (reference - ours).abs().max().item(),
            "max_abs_value": reference.abs().max().item()}


if __name__ == "__main__":
    import sys

    figures = run("--quick" in sys.argv, 2 if "--quick" in sys.argv else 5)
    pair = figures.pop("pair")
    print(f"{pair.name_a}: {pair.a * 1000:.1f} ms, {pair.name_b}: {pair.b * 1000:.1f} ms (medians, "
          f"{len(pair.times_a)} alternating repetitions after a warm-up)")
    for name, value in figures.items():
        print(f"{name}: {value:.4g}")
