"""The commands on GGUF denoisers: `plan --weights q4_k|q8_0` and `plan --files X.gguf` sized from real quantized
bytes, `inspect --model X.gguf` from the header only, `models check` recognising a GGUF file."""

from __future__ import annotations

import json

import pytest

from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main

TINY = "lorabind-tiny"


def _plan(capsys, *args) -> tuple:
    code = main(["plan", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _sizes(data: dict) -> dict:
    return {c["name"]: c["bytes"] for c in data["components"]}


def test_q4_k_plan_fits_8_gib_and_32_gib_from_the_quantized_block_bytes(capsys):
    code, data = _plan(capsys, "wan2.2-t2v-a14b", "--weights", "q4_k", "--text-encoder", "bf16", "--vram", "8",
                       "--ram", "32")
    assert code == 0 and data["fits"] is True
    assert data["peak_device_bytes"] <= 8 * 1024**3 and data["peak_host_bytes"] <= 32 * 1024**3
    q4_k = _sizes(data)
    bf16 = _sizes(_plan(capsys, "wan2.2-t2v-a14b", "--vram", "80", "--text-encoder", "bf16")[1])
    fp8 = _sizes(_plan(capsys, "wan2.2-t2v-a14b", "--weights", "fp8", "--vram", "80")[1])
    # the fp8 plan stores exactly the block matrices at one byte, so bf16 - fp8 counts their values; every row of
    # the real A14B (5120 and 13824 wide) divides into Q4_K's 256-value super-blocks of 144 bytes
    # (gguf.GGML_QUANT_SIZES), and nothing else of the denoiser is quantized in the published files
    matrix_values = bf16["transformer"] - fp8["transformer"]
    assert matrix_values % 256 == 0
    assert q4_k["transformer"] == bf16["transformer"] - 2 * matrix_values + matrix_values // 256 * 144
    assert q4_k["transformer_2"] == q4_k["transformer"]
    assert q4_k["text_encoder"] == bf16["text_encoder"] and q4_k["vae"] == bf16["vae"]  # safetensors beside GGUF
    assert data["file_resident"] == []  # a GGUF denoiser is not re-read from its file: held on the host
    code, data = _plan(capsys, "wan2.2-t2v-a14b", "--weights", "q8_0", "--vram", "80")
    assert code == 0
    q8_0 = _sizes(data)
    assert q8_0["transformer"] == bf16["transformer"] - 2 * matrix_values + matrix_values // 32 * 34


def test_q8_0_plan_of_a_16_gib_machine_names_what_it_needs(capsys):
    code, data = _plan(capsys, "wan2.2-t2v-a14b", "--weights", "q8_0", "--vram", "16", "--ram", "32")
    assert code == 1 and data["fits"] is False
    assert "GiB of host memory" in data["reason"]  # two ~15 GB experts and the encoder do not fit 32 GiB


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    from lorabind.tiny_models.single_files import ensure_tiny_single_files, tiny_file_names

    root = tmp_path_factory.mktemp("gguf_commands")
    ensure_tiny_single_files([n for names in tiny_file_names().values() for n in names], root)
    return root


def test_files_plan_sizes_gguf_experts_at_their_bytes(tiny_files, capsys):
    from lorabind.loaders.io.gguf_header import read_gguf_header

    common = [tiny_files / "vae" / TINY / "wan_2.1_vae_tiny.safetensors",
              tiny_files / "text_encoders" / TINY / "umt5_tiny_bf16.safetensors"]
    sizes = {}
    for suffix in ("bf16.safetensors", "Q8_0.gguf"):
        experts = [tiny_files / "diffusion_models" / TINY / f"wan2.2_t2v_{e}_noise_tiny_{suffix}" for e in ("high", "low")]
        code, data = _plan(capsys, "--files", *map(str, experts + common), "--vram", "8")
        assert code == 0 and data["fits"] is True
        sizes[suffix] = _sizes(data)
    header = read_gguf_header(tiny_files / "diffusion_models" / TINY / "wan2.2_t2v_high_noise_tiny_Q8_0.gguf")
    quantized = [t for t in header.tensors.values() if t.quantized]
    saved = sum(2 * t.shape[0] * t.shape[1] - t.n_bytes for t in quantized)  # bf16 bytes less the Q8_0 blocks
    assert sizes["bf16.safetensors"]["transformer"] - sizes["Q8_0.gguf"]["transformer"] == saved > 0


def test_inspect_model_gguf_reports_tensors_types_and_family_from_the_header_only(tiny_files, capsys, monkeypatch):
    import gguf

    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: pytest.fail("tensor data was read"))
    path = tiny_files / "diffusion_models" / TINY / "qwen_image_tiny_Q8_0.gguf"
    assert main(["inspect", "--model", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "GGUF model file" and report["family"] == "qwen_image"
    assert "Qwen-Image (lorabind tiny) (GGUF Q8_0)" in report["model"]
    summary = report["gguf"]
    assert summary["architecture"] == "qwen_image" and summary["types"]["Q8_0"] == 4
    by_name = {t["name"]: t for t in summary["tensors"]}
    assert by_name["transformer_blocks.0.img_mlp.net.2.weight"]["type"] == "Q8_0"
    assert by_name["img_in.weight"]["type"] == "BF16" and len(by_name) == summary["tensor_count"]
    assert main(["inspect", str(path)]) == 0  # the file as FILE_OR_DIR too, as text
    text = capsys.readouterr().out
    assert "architecture qwen_image" in text and "Q8_0 x4" in text


def test_inspect_refuses_a_hostile_gguf_by_name(tmp_path, capsys):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1 << 40).to_bytes(8, "little") + bytes(8))
    assert main(["inspect", "--model", str(broken)]) == 1
    assert "broken.gguf: the header declares 1099511627776 tensors" in capsys.readouterr().err


def test_models_check_recognises_gguf_denoisers(tiny_files, tmp_path, capsys):
    prompt = {"1": {"class_type": "LoraBindCheckpointLoader", "inputs": {
        "denoiser": f"{TINY}/wan2.2_t2v_high_noise_tiny_Q8_0.gguf",
        "denoiser_low_noise": f"{TINY}/wan2.2_t2v_low_noise_tiny_Q4_0.gguf",
        "vae": f"{TINY}/wan_2.1_vae_tiny.safetensors", "text_encoder": f"{TINY}/umt5_tiny_bf16.safetensors",
        "dtype": "bfloat16"}}}
    workflow = tmp_path / "gguf.json"
    workflow.write_text(json.dumps(prompt))
    try:
        assert main(["models", "check", str(workflow), "--models", str(tiny_files)]) == 0
    finally:
        folder_paths.configure()
    out = capsys.readouterr().out
    assert "Wan2.2 T2V tiny high-noise expert (GGUF Q8_0)" in out
    assert "Wan2.2 T2V tiny low-noise expert (GGUF Q4_0)" in out


def test_merge_and_extract_refuse_a_gguf_model_by_name(tiny_files, tmp_path, capsys):
    from lorabind.tiny_models.lora_fixtures import write_fixture_loras

    lora = next(p for p in write_fixture_loras(tiny_files) if "t2v_A14b_high_noise" in p.name)
    gguf_file = tiny_files / "diffusion_models" / TINY / "wan2.2_t2v_high_noise_tiny_Q8_0.gguf"
    assert main(["merge", "--model", str(gguf_file), "--lora", str(lora), "--out", str(tmp_path / "m.safetensors")]) != 0
    assert "wan2.2_t2v_high_noise_tiny_Q8_0.gguf: a GGUF file" in capsys.readouterr().err
    bf16 = tiny_files / "diffusion_models" / TINY / "wan2.2_t2v_high_noise_tiny_bf16.safetensors"
    assert main(["extract", "--base", str(gguf_file), "--tuned", str(bf16), "--out", str(tmp_path / "x.safetensors")]) != 0
    assert "wan2.2_t2v_high_noise_tiny_Q8_0.gguf: a GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "m.safetensors").exists() and not (tmp_path / "x.safetensors").exists()
