"""The Qwen2 tokenizer of Qwen-Image's single-file text encoders (Qwen2.5-VL), offline.

The tokenizer is not in ComfyUI's ``qwen_2.5_vl_7b*`` files; ComfyUI ships it in its source tree
(``comfy/text_encoders/qwen25_tokenizer/``). Inside ComfyUI that folder is found through the ``comfy`` package;
headless, a diffusers folder's ``tokenizer/`` or an explicit path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterable, Optional

from ...errors import ModelLoadError


def qwen25_file_tokenizer(encoder, tokenizer_dirs):
    """The Qwen2 tokenizer for a Qwen2.5-VL file: from ``tokenizer_dirs``, else ComfyUI's bundled one."""
    vocab_size = encoder.config.get("text_config", encoder.config).get("vocab_size")
    return qwen25_tokenizer([*tokenizer_dirs, comfy_qwen25_tokenizer_dir()], encoder.name, vocab_size)


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
