"""`lorabind plan`: text and JSON output, exit codes, refusals."""

import json
import shutil

import pytest

from lorabind.runtime import cli


def test_json_output_has_the_agreed_fields(capsys):
    code = cli.main(["plan", "wan2.2-t2v-a14b", "--vram", "48", "--weights", "bf16", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["weights"] == "bf16" and data["choices"][0]["memory"] == "swap_experts"
    assert (data["memory"], data["resident"], data["fits"]) == ("swap_experts", ["vae", "transformer"], True)
    assert data["peak_device_bytes"] < 48 * 1024**3 < data["peak_device_bytes"] + 28 * 1024**3
    assert [c["name"] for c in data["components"]] == ["text_encoder", "transformer", "transformer_2", "vae"]


def test_plan_that_does_not_fit_exits_1_with_the_reason(capsys):
    code = cli.main(["plan", "qwen-image", "--vram", "16", "--memory", "full"])
    out = capsys.readouterr().out
    assert code == 1 and "memory: full  (DOES NOT FIT)" in out
    assert "without --memory full: q4_0 with the fp8 text encoder fits (offload_model: " in out


def test_host_memory_limit_is_checked(capsys):
    code = cli.main(["plan", "wan2.2-t2v-a14b", "--vram", "24", "--ram", "32", "--weights", "bf16", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["fits"] is False and data["host_checked"] is True
    offload_blocks = next(c for c in data["choices"] if c["memory"] == "offload_blocks")
    assert offload_blocks["fits"] is False and offload_blocks["peak_device_bytes"] < 24 * 1024**3
    assert "with 67 GiB of RAM, bf16 with the fp8 text encoder fits (offload_blocks: " in data["reason"]


def test_unknown_model_is_refused_naming_the_known_ones(capsys, tmp_path):
    code = cli.main(["plan", str(tmp_path / "nothing"), "--vram", "24"])
    err = capsys.readouterr().err
    assert code == 2 and "nothing: neither a diffusers folder" in err and "wan2.2-t2v-a14b" in err


@pytest.mark.parametrize("option", ["--vram", "--ram"])
@pytest.mark.parametrize("amount", ["nan", "inf", "1e308", "-1", "0", "lots"])
def test_memory_amounts_must_be_finite_and_positive_exit_2(capsys, option, amount):
    arguments = ["plan", "wan2.1-t2v-1.3b", "--vram", "24", option, amount]
    with pytest.raises(SystemExit) as exited:
        cli.main(arguments)
    assert exited.value.code == 2  # bad input; 1 means "does not fit"
    assert f"argument {option}: '{amount}'" in capsys.readouterr().err


def test_a_config_of_200000_layers_is_refused_before_it_is_built(capsys, tmp_path):
    from lorabind.loaders.io.shipped_configs import shipped_model_folder

    model = tmp_path / "huge"
    shutil.copytree(shipped_model_folder("wan2.1-t2v-1.3b"), model)
    config_file = model / "transformer" / "config.json"
    config = json.loads(config_file.read_text())
    config["num_layers"] = 200_000
    config_file.write_text(json.dumps(config))
    assert cli.main(["plan", str(model), "--vram", "24"]) == 2
    err = capsys.readouterr().err
    assert f"{config_file}: num_layers is 200000" in err and "at most 512" in err


def test_fp8_weights_shrink_the_denoisers_and_the_text_encoder_not_the_vae(capsys):
    sizes = {}
    for weights in ("bf16", "fp8"):
        cli.main(["plan", "wan2.2-t2v-a14b", "--vram", "80", "--weights", weights, "--text-encoder", weights, "--json"])
        sizes[weights] = {c["name"]: c["bytes"] for c in json.loads(capsys.readouterr().out)["components"]}
    gib = 1024**3
    # ComfyUI's wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors is 14.3 GB (13.3 GiB); the bf16 one 28.6 GB
    assert 13.0 * gib < sizes["fp8"]["transformer"] < 14.0 * gib < 26.0 * gib < sizes["bf16"]["transformer"]
    assert sizes["fp8"]["text_encoder"] < 0.65 * sizes["bf16"]["text_encoder"]
    assert sizes["fp8"]["vae"] == sizes["bf16"]["vae"]


def test_when_nothing_fits_the_smallest_machine_that_would_is_named(capsys):
    code = cli.main(["plan", "wan2.2-t2v-a14b", "--vram", "8", "--ram", "16", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["fits"] is False and not any(c["fits"] for c in data["choices"])
    # checked with the headroom: 25 GiB of RAM leaves 22.5 GiB, 17 GiB of device memory 16.1 GiB
    assert data["smallest_machine"] == ("with 25 GiB of RAM, q4_0 with the fp8 text encoder fits (offload_blocks: "
                                        "3.6 GiB device, 22.2 GiB host); or with 17 GiB of device memory, fp8 with "
                                        "the fp8 text encoder fits (swap_experts: 15.2 GiB device, 13.6 GiB host)")
    assert "nearest" not in data["reason"]


@pytest.mark.parametrize("model, args, memory", [
    ("wan2.2-t2v-a14b", ["--vram", "24", "--ram", "96", "--weights", "bf16"], "offload_blocks"),
    ("wan2.2-t2v-a14b", ["--vram", "24", "--ram", "32", "--weights", "fp8"], "swap_experts"),
    ("qwen-image", ["--vram", "16", "--ram", "32", "--weights", "fp8"], "offload_blocks"),
])
def test_the_common_machines_fit_with_experts_and_encoder_kept_in_their_files(capsys, model, args, memory):
    """Issue 26: a 24 GiB + 64 GiB and a 16 GiB + 32 GiB machine. The inactive expert and the text encoder (once
    it has encoded) stay in their files, so the host holds at most one expert at a time, not both plus the
    encoder."""
    code = cli.main(["plan", model, *args, "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["fits"] is True and data["memory"] == memory
    assert data["peak_host_bytes"] <= data["host_free_bytes"]
    assert "text_encoder" in data["file_resident"]
    if memory == "swap_experts":  # both experts in their files: the host peak is one expert, not two
        assert {"transformer", "transformer_2"} <= set(data["file_resident"])
        expert = next(c["bytes"] for c in data["components"] if c["name"] == "transformer")
        assert data["peak_host_bytes"] == expert


def test_files_plan_reads_single_file_headers_and_sizes_fp8_at_one_byte(tmp_path, capsys):
    from lorabind.tiny_models.single_files import ensure_tiny_single_files, tiny_file_names

    names = tiny_file_names()
    ensure_tiny_single_files([n for ns in names.values() for n in ns], tmp_path)
    sub = "lorabind-tiny"
    common = [tmp_path / "vae" / sub / "wan_2.1_vae_tiny.safetensors",
              tmp_path / "text_encoders" / sub / "umt5_tiny_bf16.safetensors"]
    bytes_of = {}
    for precision in ("bf16", "fp8_e4m3fn"):
        experts = [tmp_path / "diffusion_models" / sub / f"wan2.2_t2v_{e}_noise_tiny_{precision}.safetensors"
                   for e in ("high", "low")]
        code = cli.main(["plan", "--files", *map(str, experts + common), "--vram", "8", "--json"])
        data = json.loads(capsys.readouterr().out)
        assert code == 0 and data["fits"] is True
        bytes_of[precision] = {c["name"]: c["bytes"] for c in data["components"]}
    assert set(bytes_of["bf16"]) == {"transformer", "transformer_2", "vae", "text_encoder"}
    assert bytes_of["fp8_e4m3fn"]["transformer"] < bytes_of["bf16"]["transformer"]
    assert bytes_of["fp8_e4m3fn"]["vae"] == bytes_of["bf16"]["vae"]


def test_files_without_a_vae_are_refused_naming_what_is_missing(tmp_path, capsys):
    from lorabind.tiny_models.single_files import ensure_tiny_single_files, tiny_file_names

    ensure_tiny_single_files(tiny_file_names()["diffusion_models"], tmp_path)
    expert = tmp_path / "diffusion_models" / "lorabind-tiny" / "wan2.2_t2v_high_noise_tiny_bf16.safetensors"
    assert cli.main(["plan", "--files", str(expert), "--vram", "8"]) == 2
    assert "--files names no vae and no text_encoder file" in capsys.readouterr().err


def test_model_and_files_together_are_refused(capsys):
    assert cli.main(["plan", "qwen-image", "--files", "a.safetensors", "--vram", "8"]) == 2
    assert "give either MODEL or --files" in capsys.readouterr().err
