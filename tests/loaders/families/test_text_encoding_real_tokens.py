"""Prompt encoding over the real tokens only (issue 47 item 1).

Wan: UMT5 runs over the prompt's tokens, then zero rows pad it to 512; this must equal diffusers' padded encode
(512 positions, pads masked, pad rows zeroed) within float rounding. Stated tolerances, relative to the largest
output value: fp32 1e-5; bf16 2**-5 (about 8 bf16 steps at the top of the range; measured: 1-2 steps). A wrong
mask, a shifted position or a non-zero pad row is off by O(1).

Qwen-Image (Qwen2.5-VL) and MiniMax-H3 (Qwen3) already encode one prompt without pads: diffusers' Qwen-Image
tokenizer call pads to the longest prompt of the batch (ours is one prompt) and MiniMax-H3's pads nothing; the
tests pin that the encoder sees no pad position there.
"""

from __future__ import annotations

import types

import pytest
import torch

from lorabind.loaders.families.wan.text_encoding import encode_real_tokens, real_token_count
from lorabind.tiny_models.tokenizers import build_umt5_style_tokenizer
from lorabind.tiny_models.wan import tiny_text_stack

WAN_TOKENS = 512
PROMPTS = ("a cat", "a red car on the street at night, rain, reflections;  low quality   video " * 2, "",
           "a dog dancing " * 200)  # the last is over 512 tokens: truncated alike
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2 ** -5}


def _wan_pipeline(tokenizer, encoder):
    from diffusers import WanPipeline

    return WanPipeline(tokenizer=tokenizer, text_encoder=encoder, transformer=None, vae=None, scheduler=None)


def _real_width_umt5(vocab_size: int):
    """UMT5-XXL's position scheme (32 buckets, distance 128) and gated-gelu at a small width, 3 layers."""
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(5)
    config = UMT5Config(vocab_size=vocab_size, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_heads=4,
                        relative_attention_num_buckets=32, relative_attention_max_distance=128,
                        feed_forward_proj="gated-gelu", dropout_rate=0.0)
    return UMT5EncoderModel(config).eval()


def _encoders():
    tokenizer, tiny = tiny_text_stack()
    return {"tiny": _wan_pipeline(tokenizer, tiny),
            "xxl-positions": _wan_pipeline(tokenizer, _real_width_umt5(len(tokenizer)))}


@pytest.fixture(scope="module")
def wan_pipelines():
    return _encoders()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("encoder", ["tiny", "xxl-positions"])
def test_wan_real_token_encode_equals_padded_encode(wan_pipelines, encoder, dtype):
    pipeline = wan_pipelines[encoder]
    pipeline.text_encoder.to(dtype)
    try:
        for text in PROMPTS:
            with torch.no_grad():
                padded, _ = pipeline.encode_prompt(prompt=text, do_classifier_free_guidance=False,
                                                   max_sequence_length=WAN_TOKENS, device="cpu")
            ours = encode_real_tokens(pipeline, text, WAN_TOKENS, "cpu")
            count = real_token_count(pipeline.tokenizer, text, WAN_TOKENS)
            assert ours.shape == padded.shape == (1, WAN_TOKENS, pipeline.text_encoder.config.d_model)
            assert ours.dtype == padded.dtype == dtype
            assert torch.equal(ours[:, count:], torch.zeros_like(ours[:, count:]))  # the pads, as diffusers zeroes
            assert padded[:, :count].abs().sum(-1).gt(0).all()  # the count is the real rows, not fewer
            scale = padded.float().abs().max().item()
            error = (ours.float() - padded.float()).abs().max().item()
            assert error <= TOLERANCE[dtype] * scale, (text[:30], error, scale)
    finally:
        pipeline.text_encoder.to(torch.float32)


def test_wan_encoder_runs_over_the_real_tokens_only(wan_pipelines):
    pipeline = wan_pipelines["tiny"]
    seen = []
    hook = pipeline.text_encoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    try:
        encode_real_tokens(pipeline, "a cat", WAN_TOKENS, "cpu")
        encode_real_tokens(pipeline, "a dog dancing " * 200, WAN_TOKENS, "cpu")
    finally:
        hook.remove()
    assert seen == [3, WAN_TOKENS]  # "▁a ▁cat </s>"; a long prompt is cut at 512 as before


def test_wan_real_token_count_cleans_as_diffusers_does():
    tokenizer = build_umt5_style_tokenizer()
    assert real_token_count(tokenizer, "a    cat  ", WAN_TOKENS) == real_token_count(tokenizer, "a cat", WAN_TOKENS)
    assert real_token_count(tokenizer, "", WAN_TOKENS) == 1


def test_qwen_image_encoder_sees_no_pad_for_one_prompt():
    from lorabind.tiny_models.qwen_image import build_qwen_image_pipeline

    pipeline = build_qwen_image_pipeline()
    masks = []
    hook = pipeline.text_encoder.register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True)
    try:
        with torch.no_grad():
            embeds, _ = pipeline.encode_prompt(prompt="a cat", device="cpu")
    finally:
        hook.remove()
    assert len(masks) == 1 and bool(masks[0].all())
    assert embeds.shape[1] == masks[0].shape[1] - pipeline.prompt_template_encode_start_idx


def test_minimax_h3_encoder_sees_no_pad():
    from lorabind.loaders.families.minimax_h3 import pipeline as minimax
    from lorabind.tiny_models import minimax_h3

    tokenizer = minimax_h3._tokenizer()
    encoder = minimax_h3._text_encoder(len(tokenizer))
    model = types.SimpleNamespace(components={}, pipeline=types.SimpleNamespace(tokenizer=tokenizer,
                                                                                 text_encoder=encoder))
    seen = []
    hook = encoder.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"]),
                                             with_kwargs=True)
    try:
        embeds = minimax.encode_prompt(model, "a cat dances")
    finally:
        hook.remove()
    assert seen[0].shape[1] == embeds.embeds.shape[1] == len(tokenizer("a cat dances").input_ids)
    assert not (seen[0] == tokenizer.pad_token_id).any()
