"""``lorabind extract`` on ComfyUI's single denoiser files: a file read as ``ComponentWeights`` reads a folder.

Why: people have single files (a published fp8 Wan2.2 expert, the one ``merge`` baked the lightx2v pair into), and
the extractor compares tensors by diffusers name. So the file is read through its layout (``io.key_layouts``:
native names renamed, fused tensors split, any saver's key prefix stripped), each tensor one at a time, and an fp8
weight is read as its value (fp8 x ``scale_weight``, exact in float32): a base stored fp8 and a tuned file stored
bf16 then differ by what the tuning changed, not by the storage format. A folder and a file of the same model
compare with each other, since both answer in diffusers names.
"""

from __future__ import annotations

import os

from .. import fp8
from ..families import family_by_id
from ..models.single_file.detect import detect, read_shapes
from ..models.single_file.loading import build_empty, ignored_key
from ..models.single_file.shard_folders import open_weights
from .extraction import ExtractionError


class SingleFileWeights:
    """Lazy, read-only view of one single denoiser file's tensors in diffusers names (``ComponentWeights``'
    interface: ``keys``, ``tensor``, ``shapes``, ``dtypes``, ``files``, ``source``)."""

    def __init__(self, path: str):
        self.source = str(path)
        self.detected = detect(self.source, os.path.basename(self.source))
        if self.detected.is_gguf:
            raise ExtractionError(f"{self.detected.name}: a GGUF file ({self.detected.describe()}); extract reads "
                                  "safetensors single files or diffusers folders (its quantization error would "
                                  "be extracted as part of the difference)")
        if self.detected.role != "denoiser":
            raise ExtractionError(f"{self.detected.name}: extract compares denoiser files; this is a "
                                  f"{self.detected.role.replace('_', ' ')} ({self.detected.describe()})")
        self._layout = self.detected.kind.layout(self.detected.config)
        expected = build_empty(self.detected).state_dict(keep_vars=True)
        self._plan = self._layout.native_plan(expected)
        raw_shapes, raw_dtypes = read_shapes(self.source, self.detected.name)
        prefix = self.detected.prefix
        in_file = {key[len(prefix):] for key in raw_shapes if key.startswith(prefix)}
        unexpected = sorted(k for k in in_file - set(self._plan) if not ignored_key(k, self._layout))
        if unexpected:
            raise ExtractionError(f"{self.detected.name}: {len(unexpected)} tensor(s) {self.detected.title} does "
                                  f"not have, e.g. {unexpected[:3]}")
        self.native_of: dict[str, str] = {}  # diffusers key -> the native key holding it
        self.shapes: dict[str, tuple] = {}
        self.dtypes: dict[str, str] = {}
        for native, parts in self._plan.items():
            if native not in in_file:
                continue
            stored = raw_dtypes[prefix + native]
            for part in parts:
                self.native_of[part] = native
                # one part: the file's own shape (a mismatch shows in the correspondence check); fused: the split
                self.shapes[part] = tuple(raw_shapes[prefix + native]) if len(parts) == 1 else tuple(
                    expected[part].shape)
                self.dtypes[part] = "F32" if stored == "F8_E4M3" else stored  # fp8 is read as its float32 value
        self._file_keys = set(raw_shapes)
        self._handle = None

    @property
    def key_prefix(self) -> str:
        """The prefix every key of the file carries (``model.diffusion_model.``, ``diffusion_model.``, or none)."""
        return self.detected.prefix

    @property
    def component(self) -> str:
        """The component this file is, named as its family names a lone denoiser file (``transformer``)."""
        parts = family_by_id(self.detected.family).layout.single_file_parts([self.detected], None, None)
        return next(comp for comp, part in parts.items() if part is self.detected)

    def keys(self):
        return self.native_of.keys()

    def files(self) -> list:
        return [self.source]

    def tensor(self, key: str):
        """The diffusers tensor ``key``: its native tensor read, an fp8 one dequantized, a fused one split."""
        import torch


        if self._handle is None:
            self._handle = open_weights(self.source)
        prefix, native = self.detected.prefix, self.native_of[key]
        value = self._handle.get_tensor(prefix + native)
        if value.dtype == torch.float8_e4m3fn:
            fp8.refuse_nan(value, self.detected.name, prefix + native)
            value = fp8.dequantize(value, self._scale(native), torch.float32)
        return self._layout.split(native, value, self._plan[native])[key]

    def _scale(self, native: str):
        """The fp8 weight's checked ``scale_weight`` (either spelling), or None for unscaled fp8."""
        stem = self.detected.prefix + native[: -len(".weight")]
        scale_key = next((stem + s for s in fp8.SCALE_SUFFIXES if stem + s in self._file_keys), None)
        if scale_key is None:
            return None
        return fp8.checked_scale(self._handle.get_tensor(scale_key), self.detected.name, scale_key)
