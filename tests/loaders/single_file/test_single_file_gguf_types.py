"""Every ggml type lorabind reads, through a real file: the header's logical shapes and byte counts, the raw
blocks as diffusers' ``GGUFParameter``, and diffusers' per-forward dequantisation against the gguf package's own.
The gguf package cannot quantize the K-quants, so the blocks are random bytes (below 0x3C, so every fp16 scale
inside them is finite): any byte pattern is a valid block."""

import gguf
import numpy as np
import pytest
import torch
from diffusers.quantizers.gguf.utils import GGUFParameter, dequantize_gguf_tensor

from gguf_helpers import package_dequant
from lorabind.loaders import gguf_weights
from lorabind.loaders.io.gguf_header import QUANTIZED_TYPES, UNQUANTIZED_TYPES, read_gguf_header
from lorabind.loaders.io.gguf_tensors import read_gguf_tensors

ROWS = 3


@pytest.fixture(scope="module")
def every_type_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path=None, arch="wan")
    expected = {}
    for name in QUANTIZED_TYPES:
        qtype = gguf.GGMLQuantizationType[name]
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 0x3C, size=(ROWS, 2 * type_size), dtype=np.uint8)
        writer.add_tensor(f"{name}.weight", raw, raw_dtype=qtype)
        expected[name] = raw
    values = rng.standard_normal((ROWS, 32)).astype(np.float32)
    for name in UNQUANTIZED_TYPES:
        qtype = gguf.GGMLQuantizationType[name]
        writer.add_tensor(f"{name}.weight", gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        expected[name] = values
    path = tmp_path_factory.mktemp("gguf_types") / "every_type.gguf"
    writer.write_header_to_file(path=path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, expected


@pytest.mark.parametrize("name", QUANTIZED_TYPES)
def test_quantized_types_read_as_diffusers_blocks_and_dequantise_like_the_gguf_package(every_type_file, name):
    path, expected = every_type_file
    header = read_gguf_header(path)
    tensor = header.tensors[f"{name}.weight"]
    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    assert tensor.quantized and tensor.type_name == name
    assert tensor.shape == (ROWS, 2 * block_size) and tensor.n_bytes == ROWS * 2 * type_size
    raw = read_gguf_tensors(header, path.name, [tensor.name])[tensor.name]
    assert raw.dtype == torch.uint8 and raw.numpy().tolist() == expected[name].tolist()
    parameter = GGUFParameter(raw, quant_type=gguf.GGMLQuantizationType[name])
    assert tuple(parameter.quant_shape) == tensor.shape
    reference = package_dequant(tensor, raw)
    assert reference.shape == tensor.shape and bool(torch.isfinite(reference).all())
    # diffusers dequantises in fp16 (scale x quant, then the K-quants' minimum): a few fp16 roundings, measured up
    # to 2**-10 of the tensor's largest value for Q4_K; bound at 2**-9, below bf16's own resolution (2**-8)
    tolerance = reference.abs().max().item() * 2.0 ** -9
    assert (dequantize_gguf_tensor(parameter).float() - reference).abs().max().item() <= tolerance
    # the engine's float32 decoder (a weight dequantised at load, or per forward under a LoRA) is the reference
    assert torch.equal(gguf_weights.dequantize_blocks(raw, parameter.quant_type, tensor.shape), reference)


@pytest.mark.parametrize("name", UNQUANTIZED_TYPES)
def test_unquantized_types_read_as_their_values(every_type_file, name):
    path, expected = every_type_file
    header = read_gguf_header(path)
    tensor = header.tensors[f"{name}.weight"]
    values = read_gguf_tensors(header, path.name, [tensor.name])[tensor.name]
    assert not tensor.quantized and values.dtype == {"F32": torch.float32, "F16": torch.float16,
                                                     "BF16": torch.bfloat16}[name]
    exact = torch.from_numpy(expected[name]).to(values.dtype)  # the writer rounded to the type
    assert torch.equal(values, exact) and torch.equal(package_dequant(tensor, values), exact.float())
