"""Detection on files with the published models' exact key names and shapes: sparse files whose safetensors
header is real (built from the shipped configs on the meta device, written in the native layouts) and whose
data is a hole, so a 14B checkpoint costs no disk. Checks the real configs, the layouts and the detection rules
together, on ComfyUI's own file names."""

import json
import re
import struct

import pytest
import torch

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.models.single_file import catalog
from lorabind.loaders.models.single_file.detect import check_set, detect
from lorabind.loaders.models.single_file.loading import build_empty

_DTYPES = {torch.bfloat16: ("BF16", 2), torch.float8_e4m3fn: ("F8_E4M3", 1), torch.float32: ("F32", 4)}


def _sparse_file(path, kind_name: str, config_name: str, precision: str):
    """A safetensors file with the real header of ``config_name`` in the native layout, data left sparse."""
    kind = catalog.kinds()[kind_name]
    stub = type("Stub", (), {"kind": kind, "config": catalog.config(config_name)})
    module = build_empty(stub)
    layout = kind.layout(stub.config)
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    entries, offset = {}, 0

    def add(key, shape, dtype):
        nonlocal offset
        code, size = _DTYPES[dtype]
        count = 1
        for dim in shape:
            count *= dim
        entries[key] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + count * size]}
        offset += count * size

    for native, parts in layout.native_plan(shapes).items():
        shape = shapes[parts[0]]
        if len(parts) > 1:
            shape = (sum(shapes[p][0] for p in parts),) + shape[1:]
        quantized = precision != "bf16" and native.startswith(kind.quantized_prefix) and len(shape) == 2
        add(native, shape, torch.float8_e4m3fn if quantized else torch.bfloat16)
        if quantized and precision == "fp8_scaled":
            add(native[: -len(".weight")] + ".scale_weight", (), torch.float32)
    if precision == "fp8_scaled":
        add("scaled_fp8", (0,), torch.float8_e4m3fn)
    if kind_name == "umt5":
        add("spiece_model", (16,), torch.bfloat16)
    header = json.dumps(entries).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(8 + len(header) + offset)
    return path


CASES = {
    "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": ("wan_transformer", "wan_t2v_14B", "fp8_scaled",
                                                         "Wan2.2 T2V A14B high-noise expert"),
    "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": ("wan_transformer", "wan_t2v_14B", "fp8_scaled",
                                                        "Wan2.2 T2V A14B low-noise expert"),
    "wan2.1_t2v_1.3B_bf16.safetensors": ("wan_transformer", "wan2.1_t2v_1.3B", "bf16", "Wan2.1 T2V 1.3B"),
    "wan2.1_t2v_14B_fp8_e4m3fn.safetensors": ("wan_transformer", "wan_t2v_14B", "fp8_e4m3fn", "Wan2.1 T2V 14B"),
    "wan2.1_i2v_480p_14B_bf16.safetensors": ("wan_transformer", "wan2.1_i2v_14B", "bf16", "Wan2.1 I2V 14B"),
    "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors": ("wan_transformer", "wan2.2_i2v_A14B", "fp8_scaled",
                                                         "Wan2.2 I2V A14B high-noise expert"),
    "wan2.2_ti2v_5B_fp16.safetensors": ("wan_transformer", "wan2.2_ti2v_5B", "bf16", "Wan2.2 TI2V 5B"),
    "qwen_image_fp8_e4m3fn.safetensors": ("qwen_image_transformer", "qwen_image", "fp8_e4m3fn", "Qwen-Image"),
    "wan_2.1_vae.safetensors": ("wan_vae", "wan_2.1_vae", "bf16", "Wan2.1 VAE"),
    "qwen_image_vae.safetensors": ("qwen_image_vae", "qwen_image_vae", "bf16", "Qwen-Image VAE"),
    "wan2.2_vae.safetensors": ("wan22_vae", "wan2.2_vae", "bf16", "Wan2.2 VAE"),
    "clip_vision_h.safetensors": ("clip_vision", "clip_vision_h", "bf16", "CLIP ViT-H/14 vision"),
    "umt5_xxl_fp8_e4m3fn_scaled.safetensors": ("umt5", "umt5_xxl", "fp8_scaled", "umt5-xxl"),
    "qwen_2.5_vl_7b_fp8_scaled.safetensors": ("qwen25_vl", "qwen25_vl_7b", "fp8_scaled", "Qwen2.5-VL 7B"),
}


@pytest.fixture(scope="module")
def real_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real_headers")
    return {name: _sparse_file(folder / name, kind, config, precision)
            for name, (kind, config, precision, _) in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_published_files_are_detected_by_shape_and_name(real_files, name):
    kind, config, precision, title = CASES[name]
    found = detect(str(real_files[name]), name)
    assert (found.kind.kind, found.model.config, found.precision, found.title) == (kind, config, precision, title)


def _files(real_files, *names):
    return [detect(str(real_files[n]), n) for n in names]


def test_the_comfyui_wan22_set_is_accepted(real_files):
    high, low, vae, encoder = _files(real_files, "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                                     "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "wan_2.1_vae.safetensors",
                                     "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
    assert check_set([high, low], vae, encoder).describe().count("A14B") == 2


def test_the_comfyui_image_to_video_sets_are_accepted(real_files):
    ti2v, vae22, encoder = _files(real_files, "wan2.2_ti2v_5B_fp16.safetensors", "wan2.2_vae.safetensors",
                                  "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
    assert check_set([ti2v], vae22, encoder).vae.model.config == "wan2.2_vae"
    i2v, vae21, clip = _files(real_files, "wan2.1_i2v_480p_14B_bf16.safetensors", "wan_2.1_vae.safetensors",
                              "clip_vision_h.safetensors")
    assert check_set([i2v], vae21, encoder, clip).image_encoder.title == "CLIP ViT-H/14 vision"


@pytest.mark.parametrize("denoisers, vae, encoder, why", [
    (["wan2.1_t2v_1.3B_bf16.safetensors", "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"],
     "wan_2.1_vae.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "the two experts must be the same model"),
    (["wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors", "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"],
     "wan_2.1_vae.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "the two experts must be the same model"),
    (["wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"],
     "wan_2.1_vae.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "given swapped"),
    (["wan2.1_t2v_14B_fp8_e4m3fn.safetensors"], "qwen_image_vae.safetensors",
     "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "a qwen_image_vae (Qwen-Image VAE) does not go with"),
    (["qwen_image_fp8_e4m3fn.safetensors"], "qwen_image_vae.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
     "a umt5 (umt5-xxl) does not go with a qwen_image_transformer"),
    (["wan2.2_ti2v_5B_fp16.safetensors"], "wan_2.1_vae.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
     "the VAE has 16 latent channels, the denoiser 48"),
])
def test_published_files_that_do_not_fit_are_refused_naming_both(real_files, denoisers, vae, encoder, why):
    found = _files(real_files, *denoisers, vae, encoder)
    with pytest.raises(ModelLoadError, match=re.escape(why)) as error:
        check_set(found[:-2], found[-2], found[-1])
    message = str(error.value)
    named = [n for n in (*denoisers, vae, encoder) if n in message]
    assert len(named) >= 2, message


def test_a_published_fp8_set_is_planned_at_its_stored_size(real_files):
    """ComfyUI's fp8 Wan2.2 A14B expert is planned as loading holds it: about the file's own data size (fp8 block
    weights at one byte), half of its bf16 size. (umt5's fp8 ``wo`` layers are dequantized on load, so its plan
    is larger than its file by those layers' element count.)"""
    import os

    from lorabind.loaders.models.single_file.pipelines import SingleFileSet

    names = ("wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
             "wan_2.1_vae.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
    files = check_set(_files(real_files, *names[:2]), *_files(real_files, *names[2:]))
    sizes = {size.name: size for size in SingleFileSet(files).component_sizes(torch.bfloat16)}
    expert = sizes["transformer"]
    assert expert.bytes == pytest.approx(os.path.getsize(real_files[names[0]]), rel=0.03)
    assert expert.bytes / expert.parameters < 1.05  # ~1 byte a parameter, not bf16's 2
    assert sizes["transformer_2"].bytes == expert.bytes
