"""Wan's prompt encoding over the prompt's real tokens only, padded with zeros afterwards.

Why: the denoiser reads 512 text positions (``WAN_TEXT_TOKENS``), and diffusers' ``encode_prompt`` (like
ComfyUI's ``min_length=512``) runs UMT5 over all 512, pads included, then zeroes the pad rows. Under the
attention mask a real token never attends to a pad, and UMT5's relative position buckets depend only on the
distance between two real tokens, so the real rows do not depend on how many pads follow; for a 20-token prompt
running the encoder over the 20 real tokens is about 25x less work for the same rows (equal to float rounding:
the sums run over fewer masked zeros). We still go through the pipeline's ``encode_prompt`` (its prompt cleaning,
tokenizer and dtype rules stay diffusers'), asking for exactly the real token count, and add the zero rows it would
have added.
"""

from __future__ import annotations

import torch


def real_token_count(tokenizer, text: str, limit: int) -> int:
    """How many tokens ``encode_prompt`` keeps of ``text`` (cleaned as it cleans, end token included, truncated at
    ``limit``); at least one, the end token of an empty prompt."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean  # what every Wan pipeline's encode_prompt applies

    ids = tokenizer(prompt_clean(text), max_length=limit, truncation=True, add_special_tokens=True).input_ids
    return max(1, min(len(ids), limit))


def encode_real_tokens(pipeline, text: str, length: int, device) -> torch.Tensor:
    """``pipeline.encode_prompt(text, max_sequence_length=length)``'s embeds [1, length, dim], computed over the
    real tokens only: the rows past them are zeros, as diffusers writes them."""
    count = real_token_count(pipeline.tokenizer, text, length)
    with torch.no_grad():
        embeds, _ = pipeline.encode_prompt(prompt=text, do_classifier_free_guidance=False,
                                           max_sequence_length=count, device=device)
    return torch.nn.functional.pad(embeds, (0, 0, 0, length - embeds.shape[1]))
