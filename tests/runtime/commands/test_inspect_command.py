"""`lorabind inspect`: the --json shape, the text report, accounting against a model, refused files."""

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from lorabind.runtime.cli import main
from lorabind.tiny_models import lora_fixtures as F

REPORT_KEYS = {"file", "path", "format", "family", "rank", "alpha", "scale", "counts", "kinds", "metadata",
               "contract", "accounting", "warnings"}


def inspect_json(capsys, *argv):
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def tensor_names(path):
    with safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())


def test_json_report_of_a_lightx2v_file(tiny_models_root, capsys):
    path = tiny_models_root / "loras" / F.WAN22_HIGH
    report = inspect_json(capsys, str(path))
    assert set(report) == REPORT_KEYS
    assert (report["file"], report["format"], report["family"], report["rank"]) == (
        path.name, "lightx2v-native", "wan", F.FIXTURE_RANK)
    names = tensor_names(path)
    counts = report["counts"]
    assert counts["total"] == len(names)
    assert counts["down"] == counts["up"] == sum(n.endswith(".lora_down.weight") for n in names)
    assert counts["alpha"] == sum(n.endswith(".alpha") for n in names)
    assert counts["modulation"] == sum(n.endswith(".diff_m") for n in names)
    assert counts["bias"] == sum(n.endswith(".diff_b") for n in names)
    kinds = report["kinds"]
    assert set(kinds) == {"lora", "diff"}
    assert kinds["lora"]["tensors"] == counts["down"] + counts["up"] + counts["alpha"]
    assert kinds["lora"]["modules"] == counts["down"] and kinds["lora"]["ranks"] == [F.FIXTURE_RANK]
    assert kinds["diff"]["tensors"] == counts["total"] - kinds["lora"]["tensors"]
    assert report["metadata"] == F._METADATA
    contract = report["contract"]
    assert (contract["kind"], contract["steps"], contract["shift"], contract["cfg"]) == ("distill", 4, 5.0, 1.0)
    assert contract["sigmas"] == pytest.approx([1.0, 0.9375, 0.833333, 0.625, 0.0], abs=1e-6)
    assert report["accounting"] is None


def test_accounting_against_a_model_uses_the_expert_the_name_says(tiny_models_root, capsys):
    path = tiny_models_root / "loras" / F.WAN22_LOW
    report = inspect_json(capsys, str(path), "--model", str(tiny_models_root / "diffusers" / "tiny-wan22-t2v"))
    accounting = report["accounting"]
    assert accounting["component"] == "transformer_2" and accounting["model_family"] == "wan2.2_moe"
    assert accounting["counts"] == {"applied": len(tensor_names(path)), "expected_unmatched": 0, "unmatched": 0}


def test_peft_folder_reports_its_alpha_and_scale(tiny_models_root, capsys):
    report = inspect_json(capsys, str(tiny_models_root / "loras" / F.PEFT_FOLDER))
    assert (report["format"], report["rank"], report["alpha"]) == ("peft-folder", F.PEFT_RANK, F.PEFT_ALPHA)
    assert report["scale"] == pytest.approx(F.PEFT_ALPHA / F.PEFT_RANK)
    assert report["contract"] is None


def test_qwen_lightning_contract_from_the_file_name(tiny_models_root, capsys):
    report = inspect_json(capsys, str(tiny_models_root / "loras" / F.QWEN_LIGHTNING))
    assert report["family"] == "qwen_image"
    assert (report["contract"]["steps"], report["contract"]["cfg"]) == (4, 1.0)
    assert report["scale"] == pytest.approx(F.FIXTURE_ALPHA / F.FIXTURE_RANK)


def test_text_report(tiny_models_root, capsys):
    assert main(["inspect", str(tiny_models_root / "loras" / F.WAN21_DISTILL)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == Path(F.WAN21_DISTILL).name
    assert "format:   lightx2v-native" in out
    assert f"contract: {Path(F.WAN21_DISTILL).name}: distill steps=4 shift=5 cfg=1" in out


@pytest.mark.parametrize("name, data", [
    ("old_style.ckpt", b"\x80\x02not a safetensors file"),
    ("truncated.safetensors", b"\x40\x00\x00\x00\x00\x00\x00\x00{\"a\":"),
])
def test_a_refused_file_exits_non_zero_naming_it(tmp_path, capsys, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    assert main(["inspect", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("lorabind inspect: refused: ") and name in captured.err


def test_keys_that_do_not_fit_the_model_are_refused(tiny_models_root, capsys):
    path = tiny_models_root / "loras" / F.QWEN_LIGHTNING
    assert main(["inspect", str(path), "--model", str(tiny_models_root / "diffusers" / "tiny-wan21-t2v")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lorabind inspect: refused: ") and Path(F.QWEN_LIGHTNING).name in err


def test_minimax_turbo_artifact_uses_the_family_contract_dict(tmp_path, capsys):
    from lorabind.tiny_models.minimax_h3 import write_minimax_fixture_loras

    name = "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors"
    (path,) = [p for p in write_minimax_fixture_loras(tmp_path) if p.name == name]
    report = inspect_json(capsys, str(path))
    assert report["family"] == "minimax_h3"
    contract = report["contract"]
    assert (contract["kind"], contract["steps"], contract["sigma_points"]) == ("turbo", 4, 5)
    assert (contract["flow_shift"], contract["audio_flow_shift"]) == (6.0, 3.0)
    assert report["scale"] == pytest.approx(contract["alpha"] / report["rank"])
