"""Sampler ``steps=0``: "use the step count the connected contract declares" — run with a Wan distill pair and
a MiniMax-H3 Turbo adapter, refused naming the field when nothing declares one."""

from __future__ import annotations

from pathlib import Path

import pytest

import lorabind
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.runtime.cli import main

pytestmark = pytest.mark.slow  # runs whole workflows end to end

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"


def test_steps_zero_is_a_valid_sampler_input():
    steps = LoraBindSampler.INPUT_TYPES()["required"]["steps"][1]
    assert steps["min"] == 0 and "0 = the step count" in steps["tooltip"]


def _run(workflow: str, root, tmp_path, *sets) -> int:
    return main(["run", str(WORKFLOWS / workflow), "--models", str(root), "--output", str(tmp_path / "out"),
                 *[a for s in sets for a in ("--set", s)]])


def test_steps_zero_with_the_wan_pair_runs_its_four_steps(tiny_models_root, tmp_path, capsys):
    assert _run("wan22_lightx2v_4step.api.json", tiny_models_root, tmp_path, "6.steps=0") == 0
    out = capsys.readouterr().out
    assert "steps=4 " in out and "contract enforced" in out


def test_steps_zero_with_a_turbo_adapter_runs_its_declared_count(mm_root, tmp_path, capsys):
    assert _run("minimax_h3_turbo_8step.api.json", mm_root, tmp_path, "6.steps=0") == 0
    assert "steps=8 " in capsys.readouterr().out


def test_steps_zero_without_a_contract_is_refused_naming_the_field(tiny_models_root, tmp_path, capsys):
    assert _run("wan22_tiny_t2v.api.json", tiny_models_root, tmp_path, "5.steps=0") != 0
    captured = capsys.readouterr()
    assert "steps is 0" in captured.out + captured.err and "declares one" in captured.out + captured.err
