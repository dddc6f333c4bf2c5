"""The ways a model's weights can be downloaded, for ``lorabind plan``'s search: the denoisers' storage (bf16, fp8,
each GGUF type) paired with the text encoder's (bf16 or fp8), the files of each, and the size the model makes.

Why the text encoder is searched on its own: ComfyUI users pair a GGUF or fp8 denoiser with the fp8 scaled
encoder (UMT5-XXL 6.3 GiB instead of 10.6, Qwen2.5-VL 8.8 instead of 15.5); a plan that paired every GGUF file
with the bf16 encoder excluded q6_k on 12 GiB + 32 GiB and sent a 12 GiB user to an 11 GiB encoder file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..families.roles import ROLE_TEXT_ENCODER
from ..io.shipped_configs import shipped_model_folder
from .planner import DEFAULT_DECODE_SIZE
from .published import GGUF_FILE_TYPES, QUANT, published_files, read_table
from .sizes import GGUF_WEIGHTS, WEIGHTS, component_sizes, stored_as

TEXT_ENCODER_WEIGHTS = ("bf16", "fp8")  # as ComfyUI publishes the encoders (GGUF encoders are not searched)
NATIVE_SIZE_KEY = "_lorabind_native_size"  # in a shipped configuration's model_index.json


@dataclass(frozen=True)
class Storage:
    """One way to download the model: the denoisers' ``weights``, the text encoder's, the sizes they give and
    the files to get ("folder/name" under models/; empty for a diffusers folder)."""

    weights: str
    text_encoder: str
    sizes: tuple
    files: tuple = ()

    def order(self) -> tuple:
        """Closer to the original first."""
        return WEIGHTS.index(self.weights), TEXT_ENCODER_WEIGHTS.index(self.text_encoder)

    def words(self) -> str:
        """"q4_k" or "q4_k with the fp8 text encoder"."""
        return self.weights + ("" if self.text_encoder == "bf16" else f" with the {self.text_encoder} text encoder")


def storages(model, dtype: str, weights: str | None = None, text_encoder: str | None = None) -> list[Storage]:
    """Every published pairing of the denoisers' and the text encoder's storage (``weights``/``text_encoder``
    narrow them). A shipped configuration keeps only what is published (none published: every pairing, without
    files); a diffusers folder gets every pairing, without files."""
    sized = {w: component_sizes(model, dtype=dtype, weights=w)
             for w in {*([weights] if weights else WEIGHTS), *TEXT_ENCODER_WEIGHTS}}
    encoders = {w: {s.name: s for s in sized[w] if s.role == ROLE_TEXT_ENCODER} for w in TEXT_ENCODER_WEIGHTS}
    names = published_files(model)
    every = []
    for w in [weights] if weights else WEIGHTS:
        for encoder in [text_encoder] if text_encoder else TEXT_ENCODER_WEIGHTS:
            sizes = tuple(encoders[encoder].get(s.name, s) for s in sized[w])
            every.append(Storage(w, encoder, sizes, _files(names, sizes, w, encoder) or () if names else ()))
    if names is not None:
        return [s for s in every if _files(names, s.sizes, s.weights, s.text_encoder) is not None] or every
    return every


def _files(names: dict, sizes, weights: str, encoder: str) -> tuple | None:
    """The files to get, or None when one of them is not published."""
    files = []
    for size in sizes:
        kind = encoder if size.role == ROLE_TEXT_ENCODER else stored_as(size.role, weights)
        name = names.get(size.name, {}).get("gguf" if kind in GGUF_WEIGHTS else kind)
        if name is None:
            return None
        files.append(name.replace(QUANT, GGUF_FILE_TYPES.get(weights, "")))
    return tuple(files)


def native_size(model) -> tuple | None:
    """(width, height, frames) the model is made for, from its configuration's model_index.json
    (``_lorabind_native_size``: Wan2.1 1.3B 832x480, the 14B models 1280x720, Qwen-Image 1328x1328 and one
    frame); None when it does not say (the planner's ``DEFAULT_DECODE_SIZE`` is used and the answer says so)."""
    folder = shipped_model_folder(str(model)) or Path(model).expanduser()
    index = read_table(folder / "model_index.json") or {}
    size = index.get(NATIVE_SIZE_KEY)
    if not isinstance(size, dict):
        return None
    values = tuple(size.get(k) for k in ("width", "height", "frames"))
    return values if all(type(v) is int and 0 < v <= 1 << 16 for v in values) else None


def decode_size(model, width: int | None, height: int | None) -> tuple[tuple, str]:
    """((width, height, frames) to plan the decode at, where it came from): ``--width/--height`` when given (the
    other side from the native size's aspect ratio), else the native size, else ``DEFAULT_DECODE_SIZE``."""
    native = native_size(model)
    if width or height:
        base = native or (*DEFAULT_DECODE_SIZE, 81)
        width = width or round(height * base[0] / base[1] / 16) * 16
        height = height or round(width * base[1] / base[0] / 16) * 16
        return (width, height, base[2]), "--width/--height"
    if native:
        return native, "the model's native size"
    return (*DEFAULT_DECODE_SIZE, 81), "the model does not say its size: 720p assumed, --width/--height to change"
