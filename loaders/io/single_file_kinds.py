"""What a kind of single file is, as data: ``ComponentKind`` (a denoiser, VAE or text/image encoder that files of
one key layout hold), ``KnownModel`` (one published or tiny configuration of a kind), ``RefusedKind`` (files
recognised but not loaded) and ``HostDenoiser`` (a denoiser patched in a host, never loaded from its files).

Why here, below the families: each family declares the kinds and models of its own files on its layout
(``FamilyLayout.single_file_kinds`` / ``known_single_files`` / ``refused_single_files`` / ``host_denoisers``),
and the single-file layer (``models/single_file/catalog``) gathers them from the registry, so it names no family itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from .key_layouts import KeyLayout


@dataclass(frozen=True, kw_only=True)
class ComponentKind:
    """One kind of single file: a denoiser, VAE or text encoder of one family (``family``: filled in by the
    catalog from the family that declares it)."""
    kind: str  # the id files of this kind are known by in messages and ``takes``
    role: str  # "denoiser", "vae", "text_encoder", "image_encoder"
    markers: tuple[str, ...]  # keys whose presence identifies the kind (all of them)
    library: str
    class_name: str
    file_signature: Callable[[dict], tuple]  # {key: shape} -> signature
    config_signature: Callable[[dict], tuple]  # config dict -> signature
    layout: Callable[[dict], KeyLayout]  # config -> layout
    family: str = ""
    quantized_prefix: str = "blocks."
    takes: tuple[str, ...] = ()  # denoisers: the VAE, text-encoder and image-encoder kinds they work with
    experts: bool = False  # denoisers: a model of this kind may come as two experts (Wan2.2 A14B)
    name_hint: str = ""  # a regex the file name must match to pick this kind among equal-shaped ones
    # denoisers: the ``general.architecture`` published GGUF files of this kind declare (ComfyUI-GGUF's names)
    gguf_architecture: str = ""
    excludes: tuple[str, ...] = ()  # keys whose presence rules the kind out (a Wan file with a VACE branch)
    flag_keys: tuple[str, ...] = ()  # weightless keys that mark an edition of equal shapes (Qwen-Image-Edit-2511)
    # text encoders: ``tokenizer(detected file, tokenizer folders)`` -> the tokenizer that goes with the file
    tokenizer: Optional[Callable] = None
    # parameters a file may leave out, tied to the input embeddings then (Qwen2.5-VL's unused ``lm_head``)
    tied_to_embeddings: tuple[str, ...] = ()

    def fits(self, shapes: dict) -> bool:
        """The file has the kind's marker keys and none of its excluded keys."""
        return all(m in shapes for m in self.markers) and not any(x in shapes for x in self.excludes)


@dataclass(frozen=True, kw_only=True)
class KnownModel:
    config: str  # file stem under the shipped configs (or a config.json path)
    kind: str
    title: str  # "Qwen-Image"; Wan denoisers are titled from the version/expert the file name gives
    size: str  # "1.3B", "14B", "5B", "20B", "7B", "xxl", "tiny"
    variant: Optional[str] = None  # "t2v", "i2v", "ti2v" for Wan denoisers


@dataclass(frozen=True, kw_only=True)
class HostDenoiser:
    """A denoiser lorabind maps LoRAs onto inside a host (ComfyUI's own MODEL, known by its state-dict names) but
    does not load from its single files (MiniMax-H3: ``RefusedKind``): its marker keys and native key layout."""
    markers: tuple[str, ...]
    layout: KeyLayout
    family: str = ""

    def fits(self, shapes: dict) -> bool:
        return all(m in shapes for m in self.markers)


@dataclass(frozen=True)
class RefusedKind:
    """Single files lorabind recognises (by marker keys) but does not load, with what to use instead."""
    title: str
    marker_sets: tuple[tuple[str, ...], ...]  # any set fully present: this kind (native names, diffusers names)
    instead: str

    def matches(self, shapes: dict) -> bool:
        return any(all(m in shapes for m in markers) for markers in self.marker_sets)


def count_indices(shapes: dict, pattern: str) -> int:
    """How many distinct block indices (``pattern``'s first group) the file's keys name."""
    regex = re.compile(pattern)
    return len({m[1] for key in shapes for m in [regex.match(key)] if m})
