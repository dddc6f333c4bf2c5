"""The README's first command is the product in one line: ``lorabind run`` on the lightx2v high/low pair
workflow. Its output must say what happened: a fuse on each expert, the 4-step contract enforced, and the switch
from the high-noise to the low-noise expert at the boundary; every line the Quick start shows of it is printed. A
published LoRA name outside ``lorabind-tiny/`` that is missing fails validation with the choices and writes no file."""

import json
import re
import shlex
from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.models import store
from lorabind.runtime.cli import main
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW

PACK = Path(lorabind.__file__).parent


def quick_start() -> str:
    return PACK.joinpath("README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1]


def readme_main_command() -> list:
    """The arguments after ``lorabind`` of the Quick start's first ``lorabind run`` command."""
    line = next(line for line in quick_start().splitlines() if "lorabind run " in line)
    return shlex.split(line.split("lorabind run ", 1)[1])


def readme_main_output() -> list:
    """The Quick start's output block for that command, as patterns of whole lines (``/…/`` elides a path)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", quick_start(), re.S | re.M)
    block = next(body for language, body in blocks if not language)  # the first block that is no bash
    return [re.escape(line).replace(re.escape("/…/"), ".*/") for line in block.splitlines()]


@pytest.mark.slow
def test_readme_main_command_runs_the_lightx2v_pair_and_says_so(tiny_models_root, tmp_path, capsys):
    (workflow,) = readme_main_command()
    assert workflow == "workflows/wan22_lightx2v_4step.json"
    store.clear_cache()  # a first run, as the README's: no model bound by an earlier test (its bind counts differ)
    code = main(["run", str(PACK / workflow), "--models", str(tiny_models_root), "--output", str(tmp_path / "output")])
    out, err = capsys.readouterr()
    assert code == 0, err
    # the nodes' lines (the first run's build line and the relative workflow path: the exact-sample test below)
    shown = [line for line in readme_main_output() if line.startswith("node")]
    assert len(shown) >= 5 and [line for line in shown if not re.search(f"^{line}$", out, re.MULTILINE)] == []
    sampler = [line.split(" text: ", 1)[1] for line in out.splitlines() if "(LoraBindSampler) text: " in line]
    high, low = (Path(name).name for name in (WAN22_HIGH, WAN22_LOW))
    assert f"contract enforced: {high}: distill steps=4 shift=5 cfg=1 (declared by its file name)" in sampler
    assert f"contract enforced: {low}: distill steps=4 shift=5 cfg=1 (declared by its file name)" in sampler
    assert sum(f"{high}: distill" in line for line in out.splitlines()) == 1  # the contract shown once
    assert "steps=4 shift=5 cfg=1.0 sigmas=[1.0000, 0.9375, 0.8333, 0.6250, 0.0000]" in sampler
    assert "expert switch at step 2 (σ=0.8333 < boundary 0.875): transformer -> transformer_2" in sampler
    fused = [line for line in sampler if line.startswith("bind: ") and " fused into " in line]
    assert [re.sub(r" \(\d+ file tensors, \d+ model parameters\)$", "", line) for line in fused] == [
        f"bind: {WAN22_HIGH} fused into transformer at strength 1",
        f"bind: {WAN22_LOW} fused into transformer_2 at strength 1"]
    assert all(" (0 file tensors" not in line for line in fused)
    assert re.search(r"wrote images: .*wan22_lightx2v_4step_00001_\.webp$", out, re.MULTILINE)


@pytest.mark.slow
def test_the_quick_start_sample_is_exactly_what_a_first_run_prints(tmp_path, capsys, monkeypatch):
    """Issue 45 item 9: every line, in order, and nothing else (``/…/`` stands for the local folders): a first
    run, so the tiny model and fixtures are built under a fresh models folder as on a fresh clone."""
    (workflow,) = readme_main_command()
    monkeypatch.chdir(PACK)
    store.clear_cache()
    code = main(["run", workflow, "--models", str(tmp_path / "models"), "--output", str(tmp_path / "output")])
    out, err = capsys.readouterr()
    assert code == 0, err
    printed = [line.replace(f"{tmp_path}/", "/…/") for line in out.splitlines()]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", quick_start(), re.S | re.M)
    assert printed == next(body for language, body in blocks if not language).splitlines()


def test_a_missing_published_lora_is_a_validation_error_and_no_file_is_written(tmp_path, capsys):
    prompt = json.loads((PACK / "workflows" / "api" / "wan22_lightx2v_4step.api.json").read_text(encoding="utf-8"))
    text = json.dumps(prompt).replace("lorabind-tiny/", "")  # the real published names, not the fixtures
    workflow = tmp_path / "published.api.json"
    workflow.write_text(text, encoding="utf-8")
    models = tmp_path / "models"
    (models / "loras").mkdir(parents=True)
    code = main(["run", str(workflow), "--models", str(models), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1
    high = Path(WAN22_HIGH).name
    assert f"input 'high_noise_lora': Value not in list: '{high}' not in ['None']" in err
    assert list((models / "loras").iterdir()) == []
