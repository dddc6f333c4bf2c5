"""Damaged and crafted single files are refused at load, naming the file (and the key where there is one):
broken fp8 scales, NaN fp8 weights, hostile headers, truncated files, a Wan2.1 file as a Wan2.2 expert.

Every hostile file is made at test time from a tiny file."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.models.single_file.detect import check_set, detect
from lorabind.loaders.models.single_file.loading import load_component

DENOISERS = "diffusion_models/lorabind-tiny"
SCALED = f"{DENOISERS}/wan2.1_t2v_tiny_fp8_scaled.safetensors"
PLAIN_FP8 = f"{DENOISERS}/wan2.1_t2v_tiny_fp8_e4m3fn.safetensors"


def _rewrite(root, source: str, tmp_path, name: str, change) -> str:
    """A copy of ``source`` with ``change(tensors)`` applied, saved as ``tmp_path/name``; returns the key changed."""
    tensors = load_file(str(root / source))
    key = change(tensors)
    save_file(tensors, str(tmp_path / name))
    return key


def _first_scale(tensors) -> str:
    return next(k for k in sorted(tensors) if k.endswith((".scale_weight", ".weight_scale")))


@pytest.mark.parametrize("value,words", [
    (float("nan"), "is nan"), (float("inf"), "is inf"), (0.0, "is 0.0"), (-0.5, "is -0.5"),
    (torch.tensor([0.01, 0.02]), "has shape (2,)"),
])
def test_broken_fp8_scales_are_refused_at_load_naming_file_and_key(single_file_root, tmp_path, value, words):
    def break_scale(tensors):
        key = _first_scale(tensors)
        tensors[key] = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)
        return key

    key = _rewrite(single_file_root, SCALED, tmp_path, "broken_scale.safetensors", break_scale)
    detected = detect(str(tmp_path / "broken_scale.safetensors"), "broken_scale.safetensors")
    with pytest.raises(ModelLoadError) as refused:
        load_component(detected)
    message = str(refused.value)
    assert message.startswith("broken_scale.safetensors: ") and key in message and words in message


def test_nan_fp8_weights_are_refused_at_load_naming_file_and_key(single_file_root, tmp_path):
    def poison(tensors):
        key = next(k for k in sorted(tensors) if tensors[k].dtype == torch.float8_e4m3fn)
        bits = tensors[key].view(torch.uint8).clone()
        bits.view(-1)[:3] = torch.tensor([0x7F, 0xFF, 0x7F], dtype=torch.uint8)  # e4m3fn's NaNs: +NaN, -NaN
        tensors[key] = bits.view(torch.float8_e4m3fn)
        return key

    key = _rewrite(single_file_root, PLAIN_FP8, tmp_path, "nan_weights.safetensors", poison)
    with pytest.raises(ModelLoadError, match=rf"nan_weights.safetensors: {key} holds 3 NaN fp8 value"):
        load_component(detect(str(tmp_path / "nan_weights.safetensors"), "nan_weights.safetensors"))


def _raw_file(path, header: bytes, data: bytes = b"") -> str:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return str(path)


@pytest.mark.parametrize("header,words", [
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper"),
    (b'{"a": {"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 4]}}', "invalid shape"),
    (b'{"a": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}}', "invalid shape"),
    (b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', "truncated"),
    (b"{" + b",".join(b'"k%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i
                      for i in range(100_001)) + b"}", "tensors, over the budget"),
])
def test_hostile_checkpoint_headers_are_refused_naming_the_file(tmp_path, header, words):
    path = _raw_file(tmp_path / "hostile.safetensors", header, b"\0" * 4)
    with pytest.raises(ModelLoadError, match=words) as refused:
        detect(path, "hostile.safetensors")
    assert str(refused.value).startswith("hostile.safetensors: ")


def test_a_file_truncated_after_detection_is_refused_naming_the_file(single_file_root, tmp_path):
    data = (single_file_root / SCALED).read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data)
    detected = detect(str(path), "cut.safetensors")
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"^cut.safetensors: "):
        load_component(detected)
    # and detected afresh, the header no longer fits the file
    with pytest.raises(ModelLoadError, match=r"^cut.safetensors: .*truncated"):
        detect(str(path), "cut.safetensors")


def test_a_wan21_file_is_refused_as_the_wan22_low_noise_expert_naming_both(single_file_root):
    def found(kind, name):
        return detect(str(single_file_root / kind / "lorabind-tiny" / name), name)

    high = found("diffusion_models", "wan2.2_t2v_high_noise_tiny_bf16.safetensors")
    wan21 = found("diffusion_models", "wan2.1_t2v_tiny_bf16.safetensors")
    vae = found("vae", "wan_2.1_vae_tiny.safetensors")
    encoder = found("text_encoders", "umt5_tiny_bf16.safetensors")
    with pytest.raises(ModelLoadError) as refused:
        check_set([high, wan21], vae, encoder)
    message = str(refused.value)
    assert high.name in message and wan21.name in message and "Wan2.2 low-noise expert" in message
    assert json.dumps(message)  # one plain line of text


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_loaded_single_file_set_maps_no_page_of_its_files_and_a_rewrite_loads_it_afresh(single_file_root, tmp_path):
    """Issues 52 and 61: bf16 single files loaded on the CPU stayed views of their files' mappings (a truncated
    file killed the process at the next touch, a rewritten one changed the weights); the store keyed a set by the
    files' mtimes only, so a rewrite that kept the mtime was not noticed."""
    import os
    import shutil

    from lorabind.loaders.models.single_file.pipelines import detect_set, load_single_files

    names = {"denoiser": f"{DENOISERS}/wan2.1_t2v_tiny_bf16.safetensors",
             "vae": "vae/lorabind-tiny/wan_2.1_vae_tiny.safetensors",
             "te": "text_encoders/lorabind-tiny/umt5_tiny_bf16.safetensors"}
    copies = {role: shutil.copy(single_file_root / name, tmp_path / f"{role}.safetensors")
              for role, name in names.items()}
    files = detect_set([(copies["denoiser"], "denoiser.safetensors")], (copies["vae"], "vae.safetensors"),
                       (copies["te"], "te.safetensors"))
    first = load_single_files(files, device="cpu")
    with open("/proc/self/maps", encoding="utf-8") as maps:
        assert not [line for line in maps if str(tmp_path) in line]
    stat = os.stat(copies["vae"])
    with open(copies["vae"], "r+b") as handle:  # in place, same size, the mtime set back
        handle.seek(stat.st_size - 2)
        handle.write(b"\x11\x22")
    os.utime(copies["vae"], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_single_files(files, device="cpu") is not first
