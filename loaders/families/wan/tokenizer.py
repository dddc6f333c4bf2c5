"""The umt5 tokenizer of Wan's single-file text encoders, offline.

ComfyUI's ``umt5_xxl_*`` files carry their SentencePiece model as a ``spiece_model`` uint8 tensor
(``comfy/text_encoders/wan.py``: ``UMT5XXlTokenizer`` reads ``tokenizer_data["spiece_model"]``). We read its
pieces and scores with ``sentencepiece`` and build transformers' ``T5Tokenizer`` from them (transformers 5 takes
the Unigram vocabulary directly), with the model's precompiled normalizer when it has one. transformers 4.x takes
only a model file, so there the bytes go through a private temporary file.
"""

from __future__ import annotations

import inspect
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from ...errors import ModelLoadError
from .key_layouts import SPIECE_KEY


def umt5_file_tokenizer(encoder, tokenizer_dirs):
    """The tokenizer a ComfyUI umt5 file carries in its ``spiece_model`` tensor (no folder needed)."""
    from safetensors import safe_open

    with safe_open(encoder.path, framework="pt") as handle:
        if SPIECE_KEY not in handle.keys():
            raise ModelLoadError(f"{encoder.name}: no '{SPIECE_KEY}' tensor (ComfyUI's umt5 files carry their "
                                 "SentencePiece tokenizer there); this file has none")
        model_bytes = spiece_bytes(handle.get_tensor(SPIECE_KEY))
    return umt5_tokenizer_from_spiece(model_bytes, encoder.name)


def spiece_bytes(tensor) -> bytes:
    return tensor.contiguous().numpy().tobytes()


def umt5_tokenizer_from_spiece(model_bytes: bytes, source: str, max_length: int = 512):
    """transformers' T5Tokenizer with the SentencePiece model's own vocabulary, ids and scores."""
    try:
        import sentencepiece
    except ImportError:  # pragma: no cover - depends on the environment
        raise ModelLoadError(f"{source}: reading the tokenizer inside this file needs the 'sentencepiece' package "
                             "(pip install sentencepiece; ComfyUI installs it)") from None
    from transformers import T5Tokenizer

    processor = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
    vocab = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    if [piece for piece, _ in vocab[:3]] != ["<pad>", "</s>", "<unk>"]:
        raise ModelLoadError(f"{source}: spiece_model does not start with <pad>, </s>, <unk> (not a T5/umt5 model)")
    if "vocab" not in inspect.signature(T5Tokenizer.__init__).parameters:
        return _umt5_tokenizer_from_model_file(model_bytes, max_length)
    charsmap = _precompiled_charsmap(processor)
    extra = {"_spm_precompiled_charsmap": charsmap} if charsmap else {}
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=max_length, **extra)


def _umt5_tokenizer_from_model_file(model_bytes: bytes, max_length: int):
    """transformers 4.x: its T5 tokenizers only take a ``spiece.model`` path, not a vocabulary.

    The bytes go to a private temporary file (never next to the user's model) that the fast tokenizer is
    converted from at construction; a fast tokenizer does not read the file again afterwards.
    """
    from transformers import T5TokenizerFast

    with tempfile.TemporaryDirectory(prefix="lorabind-spiece-") as folder:
        path = Path(folder) / "spiece.model"
        path.write_bytes(model_bytes)
        # legacy=False + add_prefix_space: the converted tokenizer then splits like sentencepiece itself
        # (the legacy conversion maps a leading "a" to a different piece than ComfyUI's SPieceTokenizer)
        return T5TokenizerFast(vocab_file=str(path), extra_ids=0, model_max_length=max_length, legacy=False,
                               add_prefix_space=True)


def _precompiled_charsmap(processor) -> Optional[bytes]:
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # pragma: no cover - protobuf missing: fall back to no normalizer
        return None
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(processor.serialized_model_proto())
    return proto.normalizer_spec.precompiled_charsmap or None


def build_spiece_model(pieces: Iterable[tuple[str, float]]) -> bytes:
    """A SentencePiece Unigram model proto holding exactly ``pieces`` (ids in order; 0 <pad>, 1 </s>, 2 <unk>).

    Used for the tiny umt5 file: its ids must equal the tiny diffusers folder's tokenizer so the single-file
    and folder runs are comparable token for token, which a trained model would not give.
    """
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    kinds = {"<pad>": proto.SentencePiece.CONTROL, "</s>": proto.SentencePiece.CONTROL,
             "<unk>": proto.SentencePiece.UNKNOWN}
    for piece, score in pieces:
        entry = proto.pieces.add()
        entry.piece, entry.score = piece, score
        entry.type = kinds.get(piece, proto.SentencePiece.NORMAL)
    proto.trainer_spec.model_type = proto.trainer_spec.UNIGRAM
    proto.trainer_spec.pad_id, proto.trainer_spec.eos_id, proto.trainer_spec.unk_id = 0, 1, 2
    proto.trainer_spec.bos_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.remove_extra_whitespaces = True
    return proto.SerializeToString()
