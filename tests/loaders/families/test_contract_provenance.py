"""Where a contract comes from is said everywhere it shows (file name, metadata, checkpoint); a file's
``sampling_contract`` metadata wins over its name, and a disagreement between the two is reported (issue 19)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.dispatch.contract_discovery import SamplingRequest, contract_to_dict, resolve_schedule
from lorabind.loaders.errors import ContractError
from lorabind.loaders.families.minimax_h3 import contracts as minimax_h3
from lorabind.loaders.families.qwen_image import contracts as qwen_image
from lorabind.loaders.families.wan import contracts as wan
from lorabind.loaders.handles import ModelHandle
from lorabind.runtime.cli import main

LIGHTX2V = "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"


def write_lora(folder, name, metadata=None):
    tensors = {"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.ones(4, 8),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.ones(8, 4)}
    path = folder / name
    save_file(tensors, str(path), metadata=metadata)
    return str(path)


def inspect_json(path, capsys):
    assert main(["inspect", path, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["contract"]


def wan22_handle(*contracts):
    model = SimpleNamespace(family="wan2.2_moe", name="tiny-wan22-t2v", model_index={})
    return ModelHandle(model=model, contracts=contracts)


def test_inspect_says_the_contract_comes_from_the_file_name(tmp_path, capsys):
    contract = inspect_json(write_lora(tmp_path, LIGHTX2V), capsys)
    assert (contract["steps"], contract["declared_by"], contract["note"]) == (4, "file name", "")
    assert contract["text"] == f"{LIGHTX2V}: distill steps=4 shift=5 cfg=1 (declared by its file name)"
    assert main(["inspect", write_lora(tmp_path, "renamed.safetensors")]) == 0
    assert ("contract: none declared (neither its file name nor its metadata declares one)"
            in capsys.readouterr().out)


def test_metadata_wins_over_the_name_and_the_disagreement_is_reported(tmp_path, capsys):
    path = write_lora(tmp_path, LIGHTX2V, {"sampling_contract": "steps=8, shift=5, cfg=1"})
    contract = inspect_json(path, capsys)
    assert (contract["steps"], contract["declared_by"]) == (8, "metadata")
    assert contract["note"] == "its file name suggests steps=4 shift=5 cfg=1; the metadata wins"
    # a user's own LoRA saved under the published name: its metadata says it has no contract
    mine = wan.declared_contract(LIGHTX2V, {"sampling_contract": "None"}, 4)
    assert (mine.kind, mine.steps, mine.sigmas, mine.declared_by) == ("none", None, None, "metadata")
    assert mine.note == ("sampling_contract=none in its metadata overrides the contract its file name suggests "
                         "(steps=4 shift=5 cfg=1)")
    assert mine.describe().startswith(f"{LIGHTX2V}: no contract (declared by its metadata); sampling_contract=none")
    resolved = resolve_schedule(wan22_handle(mine), None, None, SamplingRequest(steps=20, cfg=5.0, shift=3.0))
    assert (resolved.steps, resolved.overrides) == (20, ())  # nothing enforced
    # metadata alone (any name) declares; "none" on a file whose name declares nothing is simply no contract
    declared = qwen_image.declared_contract("my_lora.safetensors", {"sampling_contract": "steps=6"}, 4)
    assert (declared.steps, declared.shift, declared.cfg, declared.note) == (6, None, None, "")  # left out: open
    assert wan.declared_contract("my_lora.safetensors", {"sampling_contract": "none"}, 4) is None


@pytest.mark.parametrize("raw", ["steps=four", "steps=4, speed=2", "shift=5", "steps=0", "steps=4, steps=8"])
def test_unreadable_metadata_contract_is_refused_naming_file_and_key(raw):
    with pytest.raises(ContractError, match=r"^my\.safetensors: safetensors metadata sampling_contract=.* is "
                                            r"malformed .*write e\.g\. 'steps=4, shift=5, cfg=1' or 'none'$"):
        wan.declared_contract("my.safetensors", {"sampling_contract": raw}, 4)


def test_the_contract_error_says_where_the_contract_comes_from():
    by_name = wan.declared_contract(LIGHTX2V, {}, 64)
    with pytest.raises(ContractError) as caught:
        resolve_schedule(wan22_handle(by_name), None, None, SamplingRequest(steps=20, cfg=1.0, shift=5.0))
    assert str(caught.value).endswith("steps must be 4, got 20 (its file name declares this contract; set "
                                      "enforce_contract off to override it explicitly)")
    by_metadata = wan.declared_contract("mine.safetensors", {"sampling_contract": "steps=4"}, 64)
    with pytest.raises(ContractError, match=r"its safetensors metadata declares this contract; set enforce"):
        resolve_schedule(wan22_handle(by_metadata), None, None, SamplingRequest(steps=20, cfg=1.0, shift=5.0))


def test_minimax_contracts_say_name_metadata_or_checkpoint():
    turbo = minimax_h3.declared_contract("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors", {}, 128)
    native_metadata = {"key_format": "minimax-h3-native", "qkv_layout": "grouped", "lora_rank": "64",
                       "lora_alpha": "64", "tasks": "t2va", "base_schedule": "1.0,0.7,0.4,0.15,0.0"}
    native = minimax_h3.declared_contract("minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors",
                                          native_metadata, 64)
    pinned = minimax_h3.checkpoint_contract({"_minimax_h3": {"base_schedule": [1.0, 0.5, 0.0]}}, "merged")
    assert [c.declared_by for c in (turbo, native, pinned)] == ["file name", "metadata", "checkpoint"]
    assert contract_to_dict(pinned)["declared_by"] == "checkpoint"
    assert contract_to_dict(turbo)["text"].endswith("(declared by its file name)")
    # native metadata on a Turbo-named file: the metadata wins, and the name is reported
    renamed = minimax_h3.declared_contract("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors",
                                           native_metadata, 64)
    assert (renamed.kind, renamed.note) == ("native", "its file name follows the Turbo grammar; the native "
                                                      "metadata wins")
