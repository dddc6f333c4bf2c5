"""`lorabind merge` of a Wan2.2 high/low pair: both experts in one run, slot checks, the baked contract, asset
modes, --overwrite and atomic output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from lorabind.loaders.io.safe_output import MARKER_FILE
from lorabind.runtime.cli import main
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW

WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from lorabind.tiny_models import build_tiny, lora_fixtures

    root = tmp_path_factory.mktemp("merge_pair")
    build_tiny(root / "models", names=["tiny-wan22-t2v"])
    written = [str(p) for p in lora_fixtures.write_fixture_loras(root / "models")]
    high = next(p for p in written if p.endswith(WAN22_HIGH))
    low = next(p for p in written if p.endswith(WAN22_LOW))
    return {"model": str(root / "models" / "diffusers" / "tiny-wan22-t2v"), "high": high, "low": low}


def _merge(pair, out, *loras, extra=()):
    return main(["merge", "--model", pair["model"], *[a for lora in loras for a in ("--lora", lora)],
                 "--out", str(out), *extra])


def test_one_run_bakes_both_experts_like_two_runs(pair, tmp_path):
    assert _merge(pair, tmp_path / "both", f"transformer={pair['high']}", f"transformer_2={pair['low']}:0.5") == 0
    assert _merge(pair, tmp_path / "high", f"transformer={pair['high']}") == 0
    assert main(["merge", "--model", str(tmp_path / "high"), "--lora", f"{pair['low']}:0.5", "--component",
                 "transformer_2", "--out", str(tmp_path / "two_runs")]) == 0
    for component in ("transformer", "transformer_2"):
        one = load_file(str(tmp_path / "both" / component / WEIGHTS))
        two = load_file(str(tmp_path / "two_runs" / component / WEIGHTS))
        base = load_file(os.path.join(pair["model"], component, WEIGHTS))
        assert one.keys() == two.keys()
        assert all(one[k].equal(two[k]) for k in one)
        assert any(not one[k].equal(base[k]) for k in one)  # the LoRA really changed this expert


def test_swapped_or_misplaced_files_are_refused_naming_both(pair, tmp_path, capsys):
    out = tmp_path / "never"
    assert _merge(pair, out, f"transformer={pair['low']}", f"transformer_2={pair['high']}") == 1
    err = capsys.readouterr().err
    assert "swapped" in err and os.path.basename(WAN22_HIGH) in err and os.path.basename(WAN22_LOW) in err
    assert _merge(pair, out, f"transformer_2={pair['high']}") == 1  # a high-noise file into the low expert
    assert f"{os.path.basename(WAN22_HIGH)} says high noise but goes into transformer_2" in capsys.readouterr().err
    assert not out.exists()


def test_the_merged_folder_keeps_the_pair_contract(pair, tmp_path):
    from lorabind.loaders.dispatch.contract_discovery import SamplingRequest, resolve_schedule
    from lorabind.loaders.errors import ContractError
    from lorabind.loaders.families import checkpoint_contracts
    from lorabind.loaders.handles import ModelHandle
    from lorabind.loaders.models.store import load_model

    out = tmp_path / "baked"
    assert _merge(pair, out, f"transformer={pair['high']}", f"transformer_2={pair['low']}") == 0
    model = load_model(out)
    handle = ModelHandle(model, contracts=checkpoint_contracts(model))
    assert {c.steps for c in handle.contracts} == {4}
    assert all("baked in from" in c.source and "baked" in c.source for c in handle.contracts)
    with pytest.raises(ContractError, match=r"steps must be 4, got 20"):
        resolve_schedule(handle, None, None, SamplingRequest(steps=20, cfg=1.0, shift=5.0))
    resolved = resolve_schedule(handle, None, None, SamplingRequest(steps=4, cfg=1.0, shift=5.0))
    assert resolved.steps == 4


def test_symlink_mode_links_every_untouched_file(pair, tmp_path):
    out = tmp_path / "linked"
    assert _merge(pair, out, f"transformer={pair['high']}", extra=("--asset-mode", "symlink")) == 0
    source = Path(pair["model"])
    for path in source.rglob("*"):
        if path.is_dir():
            continue
        relative = path.relative_to(source)
        copy = out / relative
        rewritten = relative.parts[0] == "transformer" and path.suffix == ".safetensors"
        if rewritten or relative.name in ("model_index.json", MARKER_FILE):  # written anew, never linked
            assert not copy.is_symlink(), relative
        else:
            assert copy.is_symlink() and os.path.realpath(copy) == str(path.resolve()), relative


def test_overwrite_replaces_only_a_finished_folder_and_a_fault_leaves_no_output(pair, tmp_path, monkeypatch,
                                                                               capsys):
    out = tmp_path / "out"
    assert _merge(pair, out, f"transformer={pair['high']}") == 0
    assert _merge(pair, out, f"transformer={pair['high']}:0.5") == 1
    assert "already exists" in capsys.readouterr().err
    assert _merge(pair, out, f"transformer={pair['high']}:0.5", extra=("--overwrite",)) == 0
    assert '"strength": 0.5' in (out / "model_index.json").read_text()

    import safetensors.torch

    calls = []

    def failing_save(*args, **kwargs):
        calls.append(args[1])
        raise OSError("disk full (injected)")

    monkeypatch.setattr(safetensors.torch, "save_file", failing_save)
    fresh = tmp_path / "fresh"
    assert _merge(pair, fresh, f"transformer={pair['high']}", f"transformer_2={pair['low']}") == 1
    err = capsys.readouterr().err
    assert "nothing written" in err and "disk full (injected)" in err
    assert calls and not fresh.exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".lorabind-output-")]
    # and an --overwrite that fails keeps the old folder whole
    assert _merge(pair, out, f"transformer={pair['high']}:0.25", extra=("--overwrite",)) == 1
    assert '"strength": 0.5' in (out / "model_index.json").read_text()


def test_an_extract_from_the_merged_folder_keeps_the_baked_contract(pair, tmp_path):
    from safetensors import safe_open

    from lorabind.loaders.dispatch.contract_discovery import discover_contract

    out = tmp_path / "baked"
    assert _merge(pair, out, f"transformer={pair['high']}", f"transformer_2={pair['low']}") == 0
    extracted = tmp_path / "extracted_lora.safetensors"
    assert main(["extract", "--base", pair["model"], "--tuned", str(out), "--component", "transformer_2",
                 "--rank", "4", "--out", str(extracted)]) == 0
    with safe_open(str(extracted), framework="pt") as handle:
        assert handle.metadata()["sampling_contract"] == "steps=4, shift=5, cfg=1"
    contract = discover_contract(str(extracted))
    assert (contract.steps, contract.shift, contract.cfg, contract.declared_by) == (4, 5.0, 1.0, "metadata")
