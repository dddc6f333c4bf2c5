"""Real-size GGUF headers: sparse files with the published layout of Wan2.2 A14B (Q4_K) and Qwen-Image (Q8_0),
native key names and the converters' type rules, their data a hole. Detection reads the logical shapes (not the
quantized byte shapes) into the same catalog as the safetensors files, and `plan --files` sizes them exactly as
`plan --weights` sizes the shipped configurations."""

import gguf
import pytest
import torch

from gguf_builders import gguf_file, kv_string, tensor_info
from lorabind.loaders.models.single_file import catalog
from lorabind.loaders.models.single_file.detect import detect
from lorabind.loaders.models.single_file.gguf_loading import gguf_stored_bytes
from lorabind.loaders.models.single_file.loading import build_empty, fp32_modules
from lorabind.loaders.placement.sizes import component_sizes, measure_module


def _ggml_type(native: str, shape: tuple, quant: str, kind) -> str:
    """The published rule (docs/gguf.md): 2-D block matrices whose rows divide are quantized; 1-D, the
    modulation tables and the 5-D patch embedding are F32; the rest BF16."""
    block_size, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]]
    if len(shape) == 1 or len(shape) > 4 or "modulation" in native:
        return "F32"
    if native.startswith(kind.quantized_prefix) and len(shape) == 2 and shape[-1] % block_size == 0:
        return quant
    return "BF16"


def _sparse_gguf(path, kind_name: str, config_name: str, quant: str):
    kind = catalog.kinds()[kind_name]
    stub = type("Stub", (), {"kind": kind, "config": catalog.config(config_name)})
    module = build_empty(stub)
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    infos, offset = [], 0
    for native, parts in kind.layout(stub.config).native_plan(shapes).items():
        shape = shapes[parts[0]]
        type_name = _ggml_type(native, shape, quant, kind)
        qtype = gguf.GGMLQuantizationType[type_name]
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        infos.append(tensor_info(native, tuple(reversed(shape)), int(qtype), offset))
        count = 1
        for dim in shape:
            count *= dim
        offset += -(-(count // block_size * type_size) // 32) * 32
    header = gguf_file([kv_string("general.architecture", kind.gguf_architecture)], infos)
    with open(path, "wb") as handle:
        handle.write(header)
        handle.truncate(len(header) + offset)
    return path


CASES = {
    "Wan2.2-T2V-A14B-HighNoise-Q4_K_M.gguf": ("wan_transformer", "wan_t2v_14B", "Q4_K",
                                              "Wan2.2 T2V A14B high-noise expert", "wan2.2-t2v-a14b", "q4_k"),
    "Wan2.2-T2V-A14B-LowNoise-Q8_0.gguf": ("wan_transformer", "wan_t2v_14B", "Q8_0",
                                           "Wan2.2 T2V A14B low-noise expert", "wan2.2-t2v-a14b", "q8_0"),
    "qwen-image-Q8_0.gguf": ("qwen_image_transformer", "qwen_image", "Q8_0", "Qwen-Image", "qwen-image", "q8_0"),
}


@pytest.mark.parametrize("name", CASES)
def test_real_gguf_header_is_detected_and_sized_as_the_shipped_configuration(tmp_path, name):
    kind_name, config_name, quant, title, real_config, weights = CASES[name]
    path = _sparse_gguf(tmp_path / name, kind_name, config_name, quant)
    detected = detect(str(path), name)
    assert (detected.title, detected.precision, detected.is_gguf) == (title, quant.lower(), True)
    assert detected.describe() == f"{name}: {title} (GGUF {quant})"
    module = build_empty(detected)
    keep = fp32_modules(type(module), detected, torch.bfloat16)
    from_file = measure_module("transformer", "denoiser", module, torch.bfloat16, keep,
                               stored_bytes=gguf_stored_bytes(detected, module))
    shipped = next(s for s in component_sizes(real_config, weights=weights) if s.name == "transformer")
    assert from_file.bytes == shipped.bytes  # --files and --weights size the same file the same way
    assert from_file.parameters == shipped.parameters


def test_a_declared_architecture_that_is_not_the_tensors_is_refused(tmp_path):
    from gguf_builders import gguf_string
    from lorabind.loaders.errors import ModelLoadError

    path = _sparse_gguf(tmp_path / "qwen-image-Q8_0.gguf", "qwen_image_transformer", "qwen_image", "Q8_0")
    with open(path, "r+b") as handle:  # in place: the sparse file's 20 GB of hole are never read
        head = handle.read(4096)
        handle.seek(head.index(gguf_string("qwen_image")))
        handle.write(gguf_string("wan_video\0"))  # same length, another architecture

    with pytest.raises(ModelLoadError, match="qwen-image-Q8_0.gguf: declares general.architecture"):
        detect(str(path), "qwen-image-Q8_0.gguf")
