"""`lorabind plan`: text and JSON output, exit codes, refusals."""

import json
import shutil

import pytest

from lorabind.runtime import cli


def test_json_output_has_the_agreed_fields(capsys):
    code = cli.main(["plan", "wan2.2-t2v-a14b", "--vram", "48", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (data["memory"], data["resident"], data["fits"]) == ("swap_experts", ["vae", "transformer"], True)
    assert data["peak_device_bytes"] < 48 * 1024**3 < data["peak_device_bytes"] + 28 * 1024**3
    assert [c["name"] for c in data["components"]] == ["text_encoder", "transformer", "transformer_2", "vae"]


def test_plan_that_does_not_fit_exits_1_with_the_reason(capsys):
    code = cli.main(["plan", "qwen-image", "--vram", "24", "--memory", "full"])
    out = capsys.readouterr().out
    assert code == 1
    assert "memory: full  (DOES NOT FIT)" in out and "memory=offload_blocks would fit" in out


def test_host_memory_limit_is_checked(capsys):
    code = cli.main(["plan", "wan2.2-t2v-a14b", "--vram", "24", "--ram", "32", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["fits"] is False and "of host memory (32.0 GiB free)" in data["reason"]


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
    from lorabind.loaders.memory.sizes import REAL_CONFIGS_DIR

    model = tmp_path / "huge"
    shutil.copytree(REAL_CONFIGS_DIR / "wan2.1-t2v-1.3b", model)
    config_file = model / "transformer" / "config.json"
    config = json.loads(config_file.read_text())
    config["num_layers"] = 200_000
    config_file.write_text(json.dumps(config))
    assert cli.main(["plan", str(model), "--vram", "24"]) == 2
    err = capsys.readouterr().err
    assert f"{config_file}: num_layers is 200000" in err and "at most 512" in err
