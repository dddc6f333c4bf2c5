"""What a single file is, from its safetensors header alone (names, shapes, dtypes; no weight is read), and
whether a set of files fits together.

Shapes decide the family, size and variant (``catalog``); two things only the file name can say, as in
ComfyUI's own naming: which Wan2.2 A14B expert a file is (``high_noise`` / ``low_noise``: both experts have the
same shapes) and whether a Wan-layout VAE is Qwen-Image's (same network and shapes as Wan2.1's VAE; a name with
"qwen" in it decides, as ComfyUI's file names do).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Optional, Sequence

from ... import fp8
from ...contracts.baked import INDEX_KEY
from ...errors import ModelLoadError
from ...families import family_by_id
from ...io import json_limits
from ...io.gguf_header import QUANTIZED_TYPES, is_gguf_path, read_gguf_header
from ...io.regular_files import open_regular
from ...io.single_file_kinds import ComponentKind, KnownModel
from ...lora.safetensors_header import check_header_budget
from . import catalog
from .key_prefixes import DIFFUSION_PREFIXES, strip_prefix
from .shard_folders import read_folder_shapes

_EXPERT = re.compile(r"(high|low)[-_ ]?noise", re.IGNORECASE)
_WAN22 = re.compile(r"wan[-_ .]?2[._]?2", re.IGNORECASE)
_DTYPE_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}


@dataclass(frozen=True)
class Detected:
    path: str
    name: str  # as the user gave it (relative to its models folder), for messages
    kind: ComponentKind
    model: KnownModel
    precision: str  # "bf16", "fp16", "fp32", "fp8_e4m3fn", "fp8_scaled"; GGUF: its main type ("q8_0", "q4_k")
    prefix: str  # "" or "model.diffusion_model." (stripped on load)
    version: Optional[str] = None  # Wan denoisers: "2.1" / "2.2"
    expert: Optional[str] = None  # "high" / "low" when the file name says so
    # an edition of equal shapes its family tells by name or marker key ("Qwen-Image-Edit-2511"), and the config
    # fields it changes ({"zero_cond_t": True}), as sorted pairs
    edition: Optional[str] = None
    config_changes: tuple = ()

    @property
    def role(self) -> str:
        return self.kind.role

    @property
    def is_gguf(self) -> bool:
        return is_gguf_path(self.path)

    @property
    def family(self) -> str:
        return self.kind.family

    @property
    def config(self) -> dict:
        shipped = catalog.config(self.model.config)
        return {**shipped, **dict(self.config_changes)} if self.config_changes else shipped

    @property
    def title(self) -> str:
        """"Wan2.2 T2V A14B", "Qwen-Image", ...: Wan's version and expert come from the file name."""
        if self.edition is not None:
            return f"{self.edition} ({self.model.size})"
        if self.version is None:
            return self.model.title
        size = "A14B" if self.version == "2.2" and self.model.size == "14B" else self.model.size
        expert = f" {self.expert}-noise expert" if self.expert else ""
        return f"Wan{self.version} {self.model.variant.upper()} {size}{expert}"

    def describe(self) -> str:
        precision = f"GGUF {self.precision.upper()}" if self.is_gguf else self.precision
        return f"{self.name}: {self.title} ({precision})"


def read_shapes(path: str, name: str, *, want_metadata: bool = False):
    """({key: shape}, {key: safetensors dtype}) from the header alone, every entry checked against the file.

    Why not ``safe_open``: it maps the whole file to read the header, and mapping a 28 GB checkpoint fails on
    machines with strict overcommit even though detection reads a few kilobytes. Why the checks: a damaged or
    crafted header (nested 100K deep, a shape of ``Infinity``, tensors past the end of a truncated file) must be
    refused here, naming the file, not surface later as a raw ``RecursionError``/``OverflowError`` or a bare
    ``SafetensorError`` from the loader. ``want_metadata``: return the ``__metadata__`` dict instead.
    """
    if os.path.isdir(path):  # a folder of shards (LightX2V's native high_noise_model/): one file in parts
        return read_folder_shapes(str(path), name, read_shapes, want_metadata)
    if not str(path).endswith((".safetensors", ".sft")):
        raise ModelLoadError(f"{name}: only .safetensors single files and .gguf denoisers are read (pickle formats "
                             "are refused); convert the file first")
    try:
        with open_regular(path) as handle:
            file_size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            (length,) = struct.unpack("<Q", prefix) if len(prefix) == 8 else (0,)
            if not 0 < length <= file_size - 8:
                raise ValueError(f"header length {length} does not fit the file's {file_size} bytes (truncated?)")
            raw = handle.read(min(length, _MAX_HEADER_BYTES + 1))
        check_header_budget(raw, name, error=ModelLoadError, max_bytes=_MAX_HEADER_BYTES)
        header = json_limits.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        metadata = header.pop("__metadata__", None)
        entries = {key: _entry(key, value, file_size - 8 - length) for key, value in header.items()}
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"{name}: not a readable safetensors file: {exc}") from exc
    if want_metadata:
        return metadata if isinstance(metadata, dict) else {}
    return {k: shape for k, (shape, _) in entries.items()}, {k: dtype for k, (_, dtype) in entries.items()}


def read_metadata(path: str, name: str = "") -> dict:
    """A single file's ``__metadata__`` (what ``lorabind merge`` baked in), read and checked as ``read_shapes``
    reads the header: no mapping of the whole file. A GGUF file's key/value metadata (no ``merge`` record)."""
    if is_gguf_path(path):
        return read_gguf_header(path, name or os.path.basename(path)).metadata
    return read_shapes(path, name or os.path.basename(path), want_metadata=True)


_MAX_HEADER_BYTES = 16 * 1024 * 1024  # real checkpoints' headers are well under 2 MiB


def _entry(key: str, entry, data_size: int) -> tuple:
    """(shape, dtype) of one header entry, or ValueError naming the key: integer dimensions, and data that lies
    inside the file."""
    if not isinstance(entry, dict):
        raise ValueError(f"entry {key!r} is not an object")
    shape, dtype, offsets = entry.get("shape"), entry.get("dtype"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"tensor {key!r} has an invalid shape {shape!r}")
    if not isinstance(dtype, str):
        raise ValueError(f"tensor {key!r} has an invalid dtype {dtype!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"tensor {key!r} has invalid data_offsets {offsets!r}")
    if offsets[1] > data_size:
        raise ValueError(f"tensor {key!r} ends at byte {offsets[1]} of a {data_size}-byte data buffer; the file "
                         "is truncated")
    return tuple(shape), dtype


def _file_shapes(path: str, name: str) -> tuple:
    """({key: logical shape}, {key: dtype or ggml type name}, GGUF ``general.architecture`` or None)."""
    if is_gguf_path(path):
        header = read_gguf_header(path, name)
        tensors = header.tensors.values()
        return {t.name: t.shape for t in tensors}, {t.name: t.type_name for t in tensors}, header.architecture
    return (*read_shapes(path, name), None)


def _precision(shapes: dict, dtypes: dict) -> str:
    quantized = [d for d in dtypes.values() if d in QUANTIZED_TYPES]
    if quantized:  # a GGUF file: its most frequent quantization, as its published name says it ("Q4_K_M")
        return max(set(quantized), key=quantized.count).lower()
    if fp8.SCALED_MARKER in shapes or any(k.endswith(fp8.SCALE_SUFFIXES) for k in shapes):
        return "fp8_scaled"
    if any(d == "F8_E4M3" for d in dtypes.values()):
        return "fp8_e4m3fn"
    weights = [dtypes[k] for k, shape in shapes.items() if len(shape) >= 2 and dtypes[k] in _DTYPE_NAMES]
    return _DTYPE_NAMES[max(set(weights), key=weights.count)] if weights else "fp32"


def _candidates(shapes: dict, base_name: str) -> list:
    """Kinds whose marker keys the file has; among equal-shaped ones (the Wan-layout VAE is also Qwen-Image's)
    the one whose name hint the file name matches, else the ones without a hint."""
    kinds = [kind for kind in catalog.kinds().values() if kind.fits(shapes)]
    hinted = [k for k in kinds if k.name_hint and re.search(k.name_hint, base_name, re.IGNORECASE)]
    return hinted or [k for k in kinds if not k.name_hint]


def _unknown_prefix(shapes: dict):
    """The one prefix before a known kind's marker keys in a file no kind matched (a saver we do not know), or
    None: such a file is refused naming it, not as "not a single file lorabind knows"."""
    for kind in catalog.kinds().values():
        marker = kind.markers[0] if kind.markers else None
        found = {key[: -len(marker)] for key in shapes if marker and key.endswith("." + marker)}
        if len(found) != 1:
            continue
        (prefix,) = found
        if all(prefix + m in shapes for m in kind.markers):
            return prefix
    return None


def detect(path: str, name: str = "", *, models: Optional[tuple] = None) -> Detected:
    """Identify one file among ``models`` (every family's known ones by default); ``ModelLoadError`` naming the
    file (and its shapes) when nothing fits."""
    name = name or os.path.basename(path)
    models = catalog.known_models() if models is None else models
    raw_shapes, dtypes, architecture = _file_shapes(path, name)
    prefixes = {k[: len(k) - len(strip_prefix(k))] for k in raw_shapes}
    prefix = max(prefixes, key=len) if len(prefixes) == 1 else ""
    shapes = {strip_prefix(k): v for k, v in raw_shapes.items()}
    dtypes = {strip_prefix(k): v for k, v in dtypes.items()}  # keyed like shapes (a raw KeyError otherwise)
    base_name = os.path.basename(name)
    kinds = _candidates(shapes, base_name)
    if not kinds:
        refused = next((r for r in catalog.refused_kinds() if r.matches(shapes)), None)
        if refused is not None:
            raise ModelLoadError(f"{name}: a {refused.title} single file, which lorabind does not load. "
                                 f"{refused.instead}")
        unknown = _unknown_prefix(shapes)
        if unknown is not None:
            raise ModelLoadError(f"{name}: its keys carry the prefix {unknown!r}, which lorabind does not know; the "
                                 f"layouts published files and ComfyUI's savers use are "
                                 f"{', '.join(repr(p) for p in DIFFUSION_PREFIXES)} or none")
        raise ModelLoadError(
            f"{name}: not a single file lorabind knows (looked for a Wan or Qwen-Image denoiser, a Wan/Qwen-Image "
            "VAE, a umt5 or Qwen2.5-VL text encoder or a CLIP vision encoder by their key names). MiniMax-H3 and "
            "other models load from diffusers folders under models/diffusers")
    mismatches = []
    for kind in kinds:
        try:
            signature = kind.file_signature(shapes)
        except KeyError as exc:
            raise ModelLoadError(f"{name}: looks like a {kind.kind} file but has no {exc} tensor") from None
        for model in models:
            if model.kind == kind.kind and kind.config_signature(catalog.config(model.config)) == signature:
                version = expert = None
                if kind.experts:  # Wan: the version and expert come from the file name
                    expert_match = _EXPERT.search(base_name)
                    expert = expert_match[1].lower() if expert_match else None
                    # Wan2.2 I2V A14B and TI2V exist only as Wan2.2; Wan2.1 I2V is the one with a CLIP image branch
                    config = catalog.config(model.config)
                    two_two = model.variant == "ti2v" or (model.variant == "i2v" and config.get("image_dim") is None)
                    version = "2.2" if two_two or expert or _WAN22.search(base_name) else "2.1"
                _check_gguf(path, name, kind, architecture)
                flags = tuple(key for key in kind.flag_keys if key in shapes)
                edition, changes = family_by_id(kind.family).layout.single_file_edition(kind.role, base_name, flags)
                return Detected(path=str(path), name=name, kind=kind, model=model,
                                precision=_precision(shapes, dtypes), prefix=prefix, version=version, expert=expert,
                                edition=edition, config_changes=tuple(sorted(changes.items())))
        known = ", ".join(m.title for m in catalog.known_models() if m.kind == kind.kind)
        mismatches.append(f"a {kind.kind} file whose shapes {signature} match no known configuration ({known})")
    # every kind whose key names the file has (the Wan2.1 and Wan2.2 VAEs share theirs) is named, with its shapes
    raise ModelLoadError(f"{name}: " + "; or ".join(mismatches) + ".")


def _check_gguf(path: str, name: str, kind: ComponentKind, architecture) -> None:
    """A GGUF file is read as a denoiser only (the published sets pair it with safetensors encoders and VAEs),
    and the architecture it declares, when it declares one, must be the one its tensors are."""
    if not is_gguf_path(path):
        return
    if kind.role != "denoiser":
        raise ModelLoadError(f"{name}: a GGUF {kind.kind} file; lorabind reads GGUF denoisers only, give the "
                             f"{kind.role.replace('_', ' ')} as a .safetensors file")
    if architecture is not None and architecture != kind.gguf_architecture:
        raise ModelLoadError(f"{name}: declares general.architecture {architecture!r} but its tensors are a "
                             f"{kind.kind} ({kind.gguf_architecture!r}); the file is mislabelled or damaged")


def detect_model_file(path: str, name: str = "") -> Optional[Detected]:
    """The file as a model single file, or None when it is none (a LoRA file, a folder): how ``inspect`` tells
    which of the two it was given. A file ``lorabind merge`` wrote is a model file whatever else is wrong with it,
    so its detection error is raised, naming it."""
    if os.path.isfile(path) and is_gguf_path(path):
        return detect(path, name)  # never a LoRA: what is wrong with it is the model detection's to say
    if not (os.path.isfile(path) and str(path).endswith((".safetensors", ".sft"))):
        return None
    try:
        return detect(path, name)
    except ModelLoadError:
        try:
            merged = INDEX_KEY in read_metadata(path, name)
        except ModelLoadError:
            return None  # a damaged header: the LoRA reader says what is wrong with it
        if merged:
            raise
        return None


@dataclass(frozen=True)
class CheckpointSet:
    denoisers: tuple  # Detected, high-noise expert first for Wan2.2 A14B
    vae: Detected
    text_encoder: Detected
    image_encoder: Optional[Detected] = None  # Wan2.1 I2V's CLIP vision file

    @property
    def family(self) -> str:
        return self.denoisers[0].family

    @property
    def files(self) -> tuple:
        """Every file of the set, denoisers first."""
        extra = (self.image_encoder,) if self.image_encoder is not None else ()
        return (*self.denoisers, self.vae, self.text_encoder, *extra)

    def describe(self) -> str:
        return "; ".join(d.describe() for d in self.files)


def _refuse(first: Detected, second: Detected, why: str):
    raise ModelLoadError(f"{first.name} and {second.name} do not fit together: {why} "
                         f"({first.describe()}; {second.describe()})")


def check_set(denoisers: Sequence[Detected], vae: Detected, text_encoder: Detected,
              image_encoder: Optional[Detected] = None) -> CheckpointSet:
    """The files as one model, or ``ModelLoadError`` naming both files of the first pair that does not fit."""
    roles = [("denoiser", d) for d in denoisers] + [("vae", vae), ("text_encoder", text_encoder)]
    roles += [("image_encoder", image_encoder)] if image_encoder is not None else []
    for expected, item in roles:
        if item.role != expected:
            raise ModelLoadError(f"{item.name}: given as the {expected.replace('_', ' ')} but it is a "
                                 f"{item.role.replace('_', ' ')} ({item.describe()})")
    check_denoisers(denoisers)
    first = denoisers[0]
    for other in (vae, text_encoder, *([image_encoder] if image_encoder is not None else [])):
        if other.kind.kind not in first.kind.takes:
            _refuse(first, other, f"a {other.kind.kind} ({other.title}) does not go with a {first.kind.kind}, which "
                                  f"takes {' and '.join(first.kind.takes)}")
    latent = first.config["out_channels"]
    if vae.config["z_dim"] != latent:
        _refuse(first, vae, f"the VAE has {vae.config['z_dim']} latent channels, the denoiser {latent}")
    text_width = first.config.get("text_dim", first.config.get("joint_attention_dim"))
    encoder_width = text_encoder.config.get("d_model") or text_encoder.config["text_config"]["hidden_size"]
    if text_width != encoder_width:
        _refuse(first, text_encoder, f"the text encoder gives {encoder_width}-wide states, the denoiser takes "
                                     f"{text_width}")
    _check_image_encoder(first, image_encoder)
    return CheckpointSet(denoisers=tuple(denoisers), vae=vae, text_encoder=text_encoder, image_encoder=image_encoder)


def check_denoisers(denoisers: Sequence[Detected]) -> None:
    """One denoiser file, or two experts of one model in (high-noise, low-noise) order: else ``ModelLoadError``
    naming both files. Shared by the loader's set check and ``lorabind merge`` on single files."""
    if not 1 <= len(denoisers) <= 2:
        raise ModelLoadError(f"give one denoiser file, or two (high-noise, low-noise); got {len(denoisers)}")
    if len(denoisers) == 1:
        return
    first, second = denoisers
    if not (first.kind.experts and second.kind.experts):
        _refuse(first, second, "only Wan2.2 A14B has two experts")
    if first.model != second.model:
        _refuse(first, second, "the two experts must be the same model (size and variant)")
    if (first.expert, second.expert) == ("low", "high"):
        _refuse(first, second, "given swapped: the first is the low-noise expert, the second the high-noise "
                               "one; put the high-noise file first")
    if first.expert and first.expert == second.expert:
        _refuse(first, second, f"both are {first.expert}-noise experts")

    family_by_id(first.family).layout.check_expert_files((first, second))


def _check_image_encoder(denoiser: Detected, image_encoder: Optional[Detected]) -> None:
    """Wan2.1 I2V feeds a CLIP vision encoder's states to its image branch (``image_dim`` wide); no other
    denoiser takes an image encoder."""
    image_dim = denoiser.config.get("image_dim")
    if image_dim is None:
        if image_encoder is not None:
            _refuse(denoiser, image_encoder, f"{denoiser.title} takes no image encoder (only Wan2.1 I2V has a CLIP "
                                             "image branch); leave clip_vision at none")
        return
    if image_encoder is None:
        raise ModelLoadError(f"{denoiser.describe()}: Wan2.1 I2V needs its CLIP vision image encoder (ComfyUI's "
                             "models/clip_vision, clip_vision_h); give it as clip_vision")
    width = image_encoder.config["hidden_size"]
    if width != image_dim:
        _refuse(denoiser, image_encoder, f"the image encoder gives {width}-wide states, the denoiser's image "
                                         f"branch takes {image_dim}")
