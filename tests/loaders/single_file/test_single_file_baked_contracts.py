"""Issue 28: a single file `lorabind merge` baked a distill pair into shows its contract wherever one is asked:
`lorabind inspect`, the editor's contract endpoint (``folder=diffusion_models``) and the model handle
`LoraBindCheckpointLoader` builds, which the sampler enforces. All three read it through one discovery path."""

from __future__ import annotations

import json
import os

import pytest

from contract_endpoint import ask_contracts
from lorabind.loaders.dispatch.contract_discovery import contract_to_dict
from lorabind.loaders.models.store import clear_cache
from lorabind.runtime.cli import main
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW
from single_file_helpers import call

TINY = "lorabind-tiny/"
EXPERTS = ("wan2.2_t2v_high_noise_tiny_bf16.safetensors", "wan2.2_t2v_low_noise_tiny_bf16.safetensors")
MERGED = ("merged/wan2.2_t2v_high_noise_baked_bf16.safetensors", "merged/wan2.2_t2v_low_noise_baked_bf16.safetensors")
NAMED_BY_SOURCE = ("source", "text")  # each reader names the model its own way; the contract itself must agree


@pytest.fixture
def root(single_file_root, registry_at):
    registry_at(single_file_root)
    models = single_file_root / "diffusion_models"
    args = ["merge", "--overwrite", "--lora", f"transformer={single_file_root / 'loras' / WAN22_HIGH}",
            "--lora", f"transformer_2={single_file_root / 'loras' / WAN22_LOW}"]
    for expert, merged in zip(EXPERTS, MERGED):
        args += ["--model", str(models / TINY / expert), "--out", str(models / merged)]
    assert main(args) == 0
    yield single_file_root
    clear_cache()


def _contract(entry: dict) -> dict:
    return {key: value for key, value in entry.items() if key not in NAMED_BY_SOURCE}


def test_inspect_the_endpoint_and_the_loaded_model_report_the_same_baked_contract(root, capsys):
    answers = ask_contracts(list(MERGED), folder="diffusion_models")
    model, _ = call("LoraBindCheckpointLoader", denoiser=MERGED[0], denoiser_low_noise=MERGED[1],
                    vae=f"{TINY}wan_2.1_vae_tiny.safetensors", text_encoder=f"{TINY}umt5_tiny_bf16.safetensors",
                    dtype="bfloat16")
    loaded = sorted((_contract(contract_to_dict(c)) for c in model.contracts), key=json.dumps)
    served = []
    for name, (status, body) in zip(MERGED, answers):
        assert status == 200 and body["family"] == "wan" and body["reason"] is None, body
        assert body["file"] == name and os.sep + "diffusion_models" not in json.dumps(body)  # no local path
        assert main(["inspect", str(root / "diffusion_models" / name), "--json"]) == 0
        inspected = json.loads(capsys.readouterr().out)
        assert [_contract(c) for c in inspected["contracts"]] == [_contract(c) for c in body["contracts"]]
        assert [entry["component"] for entry in inspected["fused"]] == [
            "transformer" if "high" in name else "transformer_2"]
        served += [_contract(c) for c in body["contracts"]]
    assert sorted(served, key=json.dumps) == loaded and len(loaded) == 2
    assert {(c["steps"], c["shift"], c["cfg"]) for c in loaded} == {(4, 5.0, 1.0)}
    assert main(["inspect", str(root / "diffusion_models" / MERGED[0])]) == 0
    assert "contract: " in capsys.readouterr().out


def test_a_plain_file_declares_none_and_other_names_are_refused_or_confined(root, tmp_path):
    folder = root / "diffusion_models"
    (folder / "misplaced_vae.safetensors").write_bytes((root / "vae" / TINY / "wan_2.1_vae_tiny.safetensors")
                                                       .read_bytes())
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((folder / TINY / EXPERTS[0]).read_bytes())
    link = folder / "linked_out.safetensors"
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    try:
        (plain, body), (vae_status, vae), (escape, _), (linked, _) = ask_contracts(
            [TINY + EXPERTS[0], "misplaced_vae.safetensors", "../loras/x.safetensors", "linked_out.safetensors"],
            folder="diffusion_models")
    finally:
        link.unlink()
        (folder / "misplaced_vae.safetensors").unlink()
    assert plain == 200 and body["contracts"] == [] and body["family"] == "wan"
    assert body["reason"] == "its metadata carries no contract baked in by lorabind merge"
    assert vae_status == 422 and "misplaced_vae.safetensors: a vae file" in vae["reason"]
    assert escape == 400  # '..' leaves the folder
    assert linked == 404  # a link out of every diffusion_models folder reaches no file
