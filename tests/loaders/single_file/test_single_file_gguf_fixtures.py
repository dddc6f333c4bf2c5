"""The tiny GGUF fixtures: published layout (native names, architecture, which tensors are quantized) and values
within each quantization's error bound of the bf16 single file they were made from, tensor by tensor, through
the gguf package's own dequantiser."""

import pytest
import torch
from safetensors.torch import load_file

from gguf_helpers import package_dequant
from lorabind.loaders.io.gguf_header import read_gguf_header
from lorabind.loaders.io.gguf_tensors import read_gguf_tensors
from lorabind.tiny_models.gguf_files import GGUF_QUANTS, GGUF_STEMS
from lorabind.tiny_models.single_files import SUBFOLDER

# Q8_0: 32 values share one fp16 scale d = max|x| / 127 and round to the nearest of 255 levels, so
# |x - q·d16| <= d/2 + 127·|d16 - d| <= d·(1/2 + 127·2**-11). Q4_0: d = -(signed extreme)/8 and levels -8..7:
# the extreme itself is exact, but a value of the opposite sign as large clamps from +8 to 7, one whole step off,
# so |x - q·d16| <= |d| + 8·|d16 - d| <= |d|·(1 + 8·2**-11).
_BOUNDS = {"Q8_0": (127.0, 0.5 + 127 * 2.0 ** -11), "Q4_0": (8.0, 1.0 + 8 * 2.0 ** -11)}
_ARCHITECTURES = {"wan2.2_t2v_high_noise_tiny": "wan", "wan2.2_t2v_low_noise_tiny": "wan",
                  "qwen_image_tiny": "qwen_image"}


def _files(root, stem, quant):
    folder = root / "diffusion_models" / SUBFOLDER
    return folder / f"{stem}_{quant}.gguf", folder / f"{stem}_bf16.safetensors"


@pytest.mark.parametrize("quant", GGUF_QUANTS)
@pytest.mark.parametrize("stem", GGUF_STEMS)
def test_gguf_fixture_is_the_bf16_file_within_the_quantization_bound(single_file_root, stem, quant):
    gguf_path, bf16_path = _files(single_file_root, stem, quant)
    header = read_gguf_header(gguf_path)
    reference = load_file(str(bf16_path))
    assert header.architecture == _ARCHITECTURES[stem]
    assert header.metadata["general.quantization_version"] == 2
    assert set(header.tensors) == set(reference)  # the same native names, no prefix
    raw = read_gguf_tensors(header, gguf_path.name)
    scale_divisor, slack = _BOUNDS[quant]
    quantized = 0
    for name, tensor in header.tensors.items():
        expected = reference[name].float()
        assert tensor.shape == tuple(expected.shape), name
        values = package_dequant(tensor, raw[name])
        if not tensor.quantized:  # F32 / BF16 hold the bf16 file's values exactly
            assert torch.equal(values, expected), name
            continue
        quantized += 1
        blocks = expected.reshape(-1, 32)
        step = blocks.abs().amax(dim=1, keepdim=True) / scale_divisor
        error = (values.reshape(-1, 32) - blocks).abs()
        assert bool((error <= step * slack + 1e-12).all()), f"{name}: max error {error.max().item():.3g}"
        assert error.max().item() > 0  # really quantized, not stored exactly
    assert quantized >= 2


def test_gguf_fixture_types_follow_the_published_rules(single_file_root):
    header = read_gguf_header(_files(single_file_root, "wan2.2_t2v_high_noise_tiny", "Q8_0")[0])
    types = {name: tensor.type_name for name, tensor in header.tensors.items()}
    # quantized: block matrices whose rows divide into 32-value blocks (the tiny Wan's ffn.2: 32 wide)
    assert {n for n, t in types.items() if t == "Q8_0"} == {"blocks.0.ffn.2.weight", "blocks.1.ffn.2.weight"}
    # 24-wide rows do not divide: left unquantized in the source dtype, as the converter's fallback does
    assert types["blocks.0.self_attn.q.weight"] == "BF16"
    # outside the blocks: never quantized (embeddings, head); 1-D, fp32 modules and the 5-D patch embedding: F32
    assert types["text_embedding.0.weight"] == "BF16" and types["head.head.weight"] == "BF16"
    assert types["blocks.0.self_attn.q.bias"] == "F32" and types["head.modulation"] == "F32"
    assert types["patch_embedding.weight"] == "F32" and len(header.tensors["patch_embedding.weight"].shape) == 5
