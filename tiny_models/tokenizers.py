"""Tokenizers for the tiny models, built in memory from the ``tokenizers`` library.

Why not ``T5Tokenizer(vocab=...)`` / ``Qwen2Tokenizer(vocab=..., merges=...)``: those in-memory constructors
exist only in transformers 5. A raw ``tokenizers.Tokenizer`` wrapped in ``PreTrainedTokenizerFast`` builds the
same way on transformers 4.x and 5.x, saves as a normal ``tokenizer.json`` and reloads through the pipeline's
``from_pretrained``. Both tokenizers are deterministic: no randomness, fixed training corpus.
"""

from __future__ import annotations

import string

# Whole words get their own piece so that realistic prompts tokenise into few, distinct ids.
_COMMON_WORDS = ("a", "an", "the", "cat", "dog", "dance", "dancing", "monkey", "video", "image", "red", "car",
                 "on", "street", "blurry", "low", "quality", "negative", "of", "in", "and", "with")

# QwenImagePipeline wraps every prompt in this template and drops the first 34 tokens (the system prefix); the
# tiny tokenizer is trained on it so that the prefix is exactly 34 tokens there too.
QWEN_PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
QWEN_TEMPLATE_PREFIX_TOKENS = 34
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# QwenImageEdit(Plus)Pipeline's template (diffusers 0.42, ``prompt_template_encode``) drops the first 64 tokens
# (``prompt_template_encode_start_idx``): the system prefix up to "user\n", one token per word in Qwen's real
# vocabulary. Trained on it with room for every word (512 pieces), the tiny tokenizer's prefix is 64 tokens too.
QWEN_EDIT_PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
QWEN_EDIT_PREFIX_TOKENS = 64
# Qwen2.5-VL's vision tokens: the processor expands each ``<|image_pad|>`` to the image's merged patch count.
QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def build_umt5_style_tokenizer():
    """A Unigram (SentencePiece-like) tokenizer that covers all printable ASCII, like UMT5's, appending ``</s>``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_letters + string.digits + string.punctuation
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -5.0) for c in chars]
    pieces += [("\u2581" + c, -4.0) for c in chars]
    pieces += [("\u2581" + w, -1.0) for w in _COMMON_WORDS if len(w) > 1]
    backend = Tokenizer(models.Unigram(pieces, unk_id=2))
    backend.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" +", " ")])
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=512
    )


def build_qwen_style_tokenizer(vocab_size: int = 400):
    """Byte-level BPE (Qwen2's scheme) trained on the QwenImage prompt template; ``<|im_*|>`` are special tokens."""
    corpus = [QWEN_PROMPT_TEMPLATE.format(p) for p in ("a cat", "a dog dancing", "a red car on a street")] * 20
    return _byte_level_bpe(corpus, vocab_size, QWEN_SPECIAL_TOKENS)


def build_qwen_edit_tokenizer(vocab_size: int = 512):
    """The same scheme trained on the Qwen-Image-Edit template, with Qwen2.5-VL's vision tokens as special tokens
    (``<|image_pad|>`` must stay one token for the processor to expand it)."""
    prompts = ("Picture 1: <|vision_start|><|image_pad|><|vision_end|>make the cat red",
               "<|vision_start|><|image_pad|><|vision_end|>turn the dog into a red car on a street")
    corpus = [QWEN_EDIT_PROMPT_TEMPLATE.format(p) for p in prompts] * 20
    return _byte_level_bpe(corpus, vocab_size, QWEN_SPECIAL_TOKENS + QWEN_VISION_TOKENS)


def _byte_level_bpe(corpus: list, vocab_size: int, special_tokens: tuple):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=[t for t in special_tokens if t != "<|endoftext|>"],
        model_max_length=4096,
    )
