"""The documented examples through the real CLI and the real nodes on the built-in tiny models (built on first use
into a temporary models root, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

import lorabind
from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main
from lorabind.tiny_models import lora_fixtures as F

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"


@pytest.fixture
def models_root(tiny_models_root):
    return tiny_models_root


def run(models_root, tmp_path, name, *extra):
    try:
        return main(["run", str(TEMPLATES / f"{name}.json"), "--models", str(models_root),
                     "--output", str(tmp_path / "out"), *extra])
    finally:
        folder_paths.configure()


@pytest.mark.slow
def test_following_the_contract_errors_advice_on_the_command_line_runs_and_records_the_override(
        models_root, tmp_path, capsys):
    assert run(models_root, tmp_path, "wan22_mismatched_contract") == 1
    err = capsys.readouterr().err
    assert ("steps must be 4, got 20 (its file name declares this contract; set enforce_contract off to override "
            "it explicitly)") in err
    # the advice, as a person types it (on a model whose LoRA layers are not bound yet: a cold fuse)
    from lorabind.loaders.binding.bind import unbind
    from lorabind.loaders.models.store import load_model

    unbind(load_model(str(models_root / "diffusers" / "tiny-wan22-t2v")))
    assert run(models_root, tmp_path, "wan22_mismatched_contract", "--set", "6.enforce_contract=off") == 0
    captured = capsys.readouterr()
    out = captured.out
    # stdout and stderr are not terminals here: plain progress lines, fusing under its own label
    assert "\r" not in out + captured.err and "\x1b" not in out + captured.err
    assert "node 6: binding LoRA layers" in captured.err and "node 6: steps 20/20" in captured.err
    assert (f"node 6 (LoraBindSampler) text: contract override: steps=20 overrides {Path(F.WAN22_HIGH).name} "
            "(steps=4 in its contract)") in out
    assert list((tmp_path / "out" / "lorabind").glob("wan22_mismatched_contract_*.webp"))
    # the pair's contract summary once (node 5 declares it; the sampler's repeat is not printed again)
    contract_lines = [line for line in out.splitlines() if f"{Path(F.WAN22_HIGH).name}: distill" in line]
    assert [line.split(" text:")[0] for line in contract_lines] == ["node 5 (WanMoELoRAPair)"]


def test_a_run_that_builds_the_tiny_models_says_so_in_one_line(tmp_path, capsys):
    from lorabind.runtime.commands.run import ensure_models

    prompt = {"1": {"class_type": "LoraBindModelLoader", "inputs": {"model_name": "tiny-wan21-t2v"}},
              "2": {"class_type": "FuseDistillLoRA", "inputs": {"lora_name": F.WAN21_DISTILL}}}
    ensure_models(prompt, str(tmp_path / "models"), str(tmp_path / "input"))
    assert capsys.readouterr().out == (f"building the built-in tiny model tiny-wan21-t2v and 1 fixture LoRA under "
                                       f"{tmp_path / 'models'} (first use; offline, random weights)\n")
    assert (tmp_path / "models" / "loras" / F.WAN21_DISTILL).is_file()
    ensure_models(prompt, str(tmp_path / "models"), str(tmp_path / "input"))  # all present now: nothing built, nothing said
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_the_edit_example_runs_and_20_steps_are_refused_naming_the_lightning_edit_file(models_root, tmp_path,
                                                                                       capsys):
    """``qwen_image_edit_lightning``: the 2511 Lightning edit file's contract is enforced as the run shows it, and
    the same workflow asked for 20 steps is refused before any model loads, naming the file."""
    name = Path(F.QWEN_EDIT_LIGHTNING).name
    inputs = ["--input", str(tmp_path / "input")]
    assert run(models_root, tmp_path, "qwen_image_edit_lightning", *inputs, "--set", "6.steps=20") == 1
    assert f"{name} is a 4-step distill LoRA: steps must be 4, got 20" in capsys.readouterr().err
    assert run(models_root, tmp_path, "qwen_image_edit_lightning", *inputs) == 0
    out = capsys.readouterr().out
    assert f"contract enforced: {name}: distill steps=4 shift=3 cfg=1" in out
    assert "node 2 (LoraBindTextEncodeImageEdit) text: image_1 64x64: vision encoder 384x384, VAE 1024x1024" in out
    assert list((tmp_path / "out" / "lorabind").glob("qwen_image_edit_lightning_*.png"))
