"""Tokenizers for single-file text encoders, offline.

umt5 (Wan): ComfyUI's ``umt5_xxl_*`` files carry their SentencePiece model as a ``spiece_model`` uint8 tensor
(``comfy/text_encoders/wan.py``: ``UMT5XXlTokenizer`` reads ``tokenizer_data["spiece_model"]``). We read its
pieces and scores with ``sentencepiece`` and build transformers' ``T5Tokenizer`` from them (transformers 5 takes
the Unigram vocabulary directly), with the model's precompiled normalizer when it has one. transformers 4.x takes
only a model file, so there the bytes go through a private temporary file.

Qwen2.5-VL (Qwen-Image): the tokenizer is not in ComfyUI's ``qwen_2.5_vl_7b*`` files; ComfyUI ships it in its
source tree (``comfy/text_encoders/qwen25_tokenizer/``). Inside ComfyUI that folder is found through the
``comfy`` package; headless, a diffusers folder's ``tokenizer/`` or an explicit path.
"""

from __future__ import annotations

import importlib.util
import inspect
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from ...errors import ModelLoadError


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


QWEN_TOKENIZER_FILES = ("vocab.json", "merges.txt")


def comfy_qwen25_tokenizer_dir() -> Optional[Path]:
    """ComfyUI's bundled ``comfy/text_encoders/qwen25_tokenizer`` when the ``comfy`` package is importable
    (found without importing it)."""
    spec = importlib.util.find_spec("comfy")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        candidate = Path(root) / "text_encoders" / "qwen25_tokenizer"
        if candidate.is_dir():
            return candidate
    return None


def qwen25_tokenizer(candidates: Iterable[Optional[Path]], source: str, vocab_size: Optional[int] = None):
    """The first candidate folder holding a Qwen2 tokenizer whose ids fit the text encoder (``vocab_size`` rows of
    its embedding); else an error naming every place looked at. Why the fit: folders of other Qwen2.5-VL models
    sit side by side (an edit model's tokenizer adds its vision tokens), and a tokenizer with more ids than the
    embedding has rows fails mid-encode with an opaque index error."""
    looked = []
    for folder in candidates:
        if folder is None:
            continue
        folder = Path(folder)
        if (folder / "tokenizer.json").is_file() or all((folder / f).is_file() for f in QWEN_TOKENIZER_FILES):
            tokenizer = _qwen25_tokenizer_in(folder)
            if vocab_size is None or len(tokenizer) <= vocab_size:
                return tokenizer
            looked.append(f"{folder} ({len(tokenizer)} ids, more than the encoder's {vocab_size})")
            continue
        looked.append(str(folder))
    where = "; ".join(looked) if looked else "no candidate folder"
    raise ModelLoadError(
        f"{source}: a Qwen2.5-VL text encoder file carries no tokenizer. Looked for tokenizer.json or "
        f"vocab.json + merges.txt that fit its vocabulary in: {where}. Inside ComfyUI it is "
        "comfy/text_encoders/qwen25_tokenizer; headless, pass --tokenizer DIR or put a diffusers Qwen-Image "
        "folder's tokenizer/ under models/")


def _qwen25_tokenizer_in(folder: Path):
    from transformers import AutoTokenizer, Qwen2Tokenizer

    if (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return Qwen2Tokenizer.from_pretrained(str(folder), local_files_only=True)
