"""`lorabind inspect --json` on MiniMax-H3 artifacts: the contract keys, and refused files exit 1 naming the file."""

from __future__ import annotations

import json
import shutil

import pytest

from lorabind.runtime.cli import main
from lorabind.tiny_models.minimax_h3 import FIXTURE_RANK, NATIVE_FIXTURE_NAME

CONTRACT_KEYS = {"kind", "steps", "sigma_points", "flow_shift", "audio_flow_shift", "tasks", "alpha", "rank", "scale",
                 "base_schedule"}
T4_768 = "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors"


def contract_of(capsys, path):
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert CONTRACT_KEYS <= set(report["contract"])
    return report, report["contract"]


@pytest.mark.parametrize("name, expected", [
    # v0.1 declares no alpha: the contract's 8 (diffusers would load it at alpha = rank)
    ("minimax_h3_fl2v_turbo_4step_v0.1.safetensors",
     {"kind": "turbo", "steps": 4, "sigma_points": 5, "flow_shift": 12.0, "audio_flow_shift": 3.0,
      "tasks": ["t2va", "fl2va"], "alpha": 8.0, "base_schedule": None}),
    ("minimax_h3_ref2v_turbo_8step_v1.0_768p_bf16.safetensors",
     {"kind": "turbo", "steps": 8, "sigma_points": 9, "flow_shift": 6.0, "audio_flow_shift": 3.0,
      "tasks": ["ref2va"], "alpha": 128.0, "base_schedule": None}),
    (NATIVE_FIXTURE_NAME,
     {"kind": "native", "steps": 4, "sigma_points": 5, "flow_shift": None, "audio_flow_shift": None,
      "tasks": ["t2va"], "alpha": float(FIXTURE_RANK), "base_schedule": [1.0, 0.7, 0.4, 0.15, 0.0]}),
])
def test_inspect_json_reports_the_contract(name, expected, mm_root, capsys):
    report, contract = contract_of(capsys, mm_root / "loras" / "lorabind-tiny" / name)
    assert {key: contract[key] for key in expected} == expected
    assert contract["rank"] == report["rank"] == FIXTURE_RANK
    # the contract's scale is the one the engine applies the file at (alpha / rank), as the report's
    assert contract["scale"] == pytest.approx(expected["alpha"] / FIXTURE_RANK) == report["scale"]


@pytest.mark.parametrize("copy_as, reason", [
    ("minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors", "is a ComfyUI-layout (fused QKV)"),
    ("minimax_h3_fl2v_lightx2v_turbo_4step_v0.1_comfy.safetensors", "is a ComfyUI-layout (fused QKV)"),
    ("renamed_turbo.safetensors", "carries MiniMax-H3 Turbo metadata (key_format='minimax-h3-diffusers') but its "
                                  "name does not follow"),
])
def test_inspect_refuses_files_whose_contract_cannot_be_known(copy_as, reason, mm_root, tmp_path, capsys):
    path = tmp_path / copy_as
    shutil.copy(mm_root / "loras" / "lorabind-tiny" / T4_768, path)  # declares key_format=minimax-h3-diffusers
    assert main(["inspect", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("lorabind inspect: refused: ") and copy_as in captured.err
    assert reason in captured.err
