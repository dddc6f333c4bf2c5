"""Tiny GGUF denoisers (Q8_0 and Q4_0) in the layout the published Wan2.2 / Qwen-Image GGUF files use.

``lorabind models build-tiny`` writes them beside the tiny single files, from the same native tensors as the
bf16 single file (so a test can compare the two tensor by tensor), with the ``gguf`` package's own writer and
quantizer. The layout follows city96's ComfyUI-GGUF converters, which QuantStack's and city96's published files
come from (facts and links in ``docs/gguf.md``):

- native ComfyUI key names without a prefix (``blocks.0.self_attn.q.weight``), ``general.architecture`` "wan" or
  "qwen_image", ``general.file_type`` and ``general.quantization_version``;
- quantized: the 2-D ``.weight`` matrices inside the repeated blocks (llama.cpp's image-model rules quantize
  2-D tensors only and exclude Wan's embeddings, head and modulation, which all lie outside the blocks) whose
  rows divide into the type's blocks (32 values for Q8_0/Q4_0): a row that does not divide stays unquantized,
  as the converter's fallback leaves it. The tiny models are narrow (Wan: 24-wide attention), so only some
  matrices quantize (Wan: each block's ``ffn.2``; Qwen-Image: the feed-forward outputs) where every matrix of
  the real 5120/3072-wide models does;
- unquantized: 1-D tensors and the modules the model keeps in float32 (Wan's modulation tables) in F32, the
  5-D Conv3d patch embedding in F32 (ComfyUI-GGUF's 5-D fix), everything else in BF16, the source dtype.
The 1024-element "small tensor" threshold of ComfyUI-GGUF's convert.py only picks the unquantized base file's
dtype; every real block matrix is far above it, so it is not modelled here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..loaders.models.single_file import catalog
from .lora_fixtures import _write_if_changed

GGUF_QUANTS = ("Q8_0", "Q4_0")
# the tiny denoisers also written as GGUF (``single_files.DENOISER_FILES`` stems): Wan2.2's experts, Qwen-Image
GGUF_STEMS = ("wan2.2_t2v_high_noise_tiny", "wan2.2_t2v_low_noise_tiny", "qwen_image_tiny")
_FILE_TYPES = {"Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0"}


def gguf_types(tensors: dict, quant: str, quantized_prefix: str) -> dict:
    """{native key: ggml type name} by the published converters' rules (see the module docstring)."""
    import gguf

    block_size, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]]
    types = {}
    for key, tensor in tensors.items():
        if tensor.dim() == 1 or tensor.dim() > 4 or tensor.dtype.itemsize == 4:
            types[key] = "F32"
        elif (key.startswith(quantized_prefix) and key.endswith(".weight") and tensor.dim() == 2
              and tensor.shape[-1] % block_size == 0):
            types[key] = quant
        else:
            types[key] = "BF16"
    return types


def gguf_file_bytes(tensors: dict, types: dict, *, architecture: str, quant: str) -> bytes:
    """The GGUF file holding ``tensors`` (torch, any float dtype) stored as ``types``, as bytes."""
    import gguf

    writer = gguf.GGUFWriter(path=None, arch=architecture)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(getattr(gguf.LlamaFileType, _FILE_TYPES[quant]))
    for key, tensor in tensors.items():
        qtype = gguf.GGMLQuantizationType[types[key]]
        writer.add_tensor(key, gguf.quants.quantize(tensor.float().numpy(), qtype), raw_dtype=qtype)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.gguf"
        writer.write_header_to_file(path=path)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


def gguf_architecture(class_name: str) -> str:
    """The ``general.architecture`` published GGUF denoisers of this diffusers class declare."""
    return next(kind.gguf_architecture for kind in catalog.kinds().values()
                if kind.role == "denoiser" and kind.class_name == class_name)


def write_gguf_files(folder: Path, stem: str, tensors: dict, quantized_prefix: str, class_name: str) -> list[Path]:
    """``<stem>_<quant>.gguf`` in ``folder`` for each of ``GGUF_QUANTS`` from the bf16 single file's native
    ``tensors`` (written only when their bytes change); the paths."""
    written = []
    for quant in GGUF_QUANTS:
        data = gguf_file_bytes(tensors, gguf_types(tensors, quant, quantized_prefix),
                               architecture=gguf_architecture(class_name), quant=quant)
        path = folder / f"{stem}_{quant}.gguf"
        _write_if_changed(path, data)
        written.append(path)
    return written
