"""The Wan image-to-video distill contracts: what the i2v lightx2v pair pins (steps, cfg) and does not (shift,
expert split: LightX2V and vllm-omni publish different recipes), I2V/T2V files refused on the other kind of
expert naming both, swapped pairs and wrong steps refused before any weight is touched, boundary defaults."""

import dataclasses
import json

import pytest
import torch

from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch.contract_discovery import SamplingRequest, contract_to_dict, resolve_schedule
from lorabind.loaders.errors import ContractError, LoraBindError
from lorabind.loaders.families import family_for
from lorabind.loaders.families.wan.contracts import declared_contract
from lorabind.loaders.handles import ModelHandle
from lorabind.tiny_models import lora_fixtures as F


def _basename(name):
    """Messages name a fixture by its published file name (without the ``lorabind-tiny/`` folder)."""
    return name.rsplit("/", 1)[-1]


@pytest.fixture
def pair(registry, load_tiny):
    """``pair(model_name, high, low)`` -> WanMoELoRAPair's result on the session's tiny model."""
    from lorabind.nodes import NODE_CLASS_MAPPINGS

    def run(model_name, high=F.WAN22_I2V_HIGH, low=F.WAN22_I2V_LOW):
        return NODE_CLASS_MAPPINGS["WanMoELoRAPair"]().pair(ModelHandle(load_tiny(model_name)), high, 1.0, low, 1.0)

    return run


def test_the_i2v_pair_pins_steps_and_cfg_and_says_where_published_recipes_differ():
    for name in (F.WAN22_I2V_HIGH, F.WAN22_I2V_LOW):
        contract = declared_contract(name, {}, 64)
        assert (contract.steps, contract.cfg, contract.sigmas, contract.shift) == (4, 1.0, None, None)
        assert contract.family == "wan2.2_moe" and contract.tasks == ("i2v",)
        view = contract_to_dict(contract)
        assert view["shift"] is None and view["sigmas"] is None and view["steps"] == 4
        assert "LightX2V samples at shift 5" in view["note"] and "flow shift 12 with boundary 0.875" in view["note"]
        assert view["note"] in view["text"]
    t2v = declared_contract(F.WAN22_HIGH, {}, 64)  # the T2V pair keeps its one published schedule
    assert t2v.shift == 5.0 and t2v.sigmas == shifted_sigmas(4, 5.0) and t2v.tasks is None
    wan21_i2v = declared_contract(F.WAN21_I2V_DISTILL, {}, 64)  # LightX2V's only published Wan2.1 I2V recipe
    assert (wan21_i2v.family, wan21_i2v.shift, wan21_i2v.tasks) == ("wan2.1", 5.0, ("i2v",))


def test_inspect_shows_the_i2v_contract_not_the_t2v_one(tiny_models_root, capsys):
    from lorabind.runtime.cli import main

    assert main(["inspect", str(tiny_models_root / "loras" / F.WAN22_I2V_HIGH), "--json"]) == 0
    contract = json.loads(capsys.readouterr().out)["contract"]
    assert (contract["steps"], contract["cfg"], contract["shift"], contract["tasks"]) == (4, 1.0, None, ["i2v"])


@pytest.mark.parametrize("shift, boundary, high_steps", [(12.0, 0.875, 3), (5.0, None, 2)])
def test_both_published_recipes_run_on_the_i2vpair(pair, shift, boundary, high_steps):
    handle = pair("tiny-wan22-i2v")["result"][0]
    request = SamplingRequest(steps=4, cfg=1.0, shift=shift, boundary=boundary)
    resolved = resolve_schedule(handle, None, None, request)
    assert resolved.overrides == () and resolved.sigmas == shifted_sigmas(4, shift)
    experts = family_for(handle.model).sampling.experts_per_step(handle.model, resolved)
    assert experts == ["transformer"] * high_steps + ["transformer_2"] * (4 - high_steps)


@pytest.mark.parametrize("field, request_values, message", [
    ("steps", dict(steps=8, cfg=1.0), "steps must be 4, got 8"),
    ("cfg", dict(steps=4, cfg=3.5), "cfg must be 1, got 3.5"),
])
def test_wrong_steps_or_cfg_are_refused_naming_the_file_and_field(pair, field, request_values, message):
    handle = pair("tiny-wan22-i2v")["result"][0]
    with pytest.raises(ContractError, match=f"{_basename(F.WAN22_I2V_HIGH)} is a 4-step distill LoRA: {message}"):
        resolve_schedule(handle, None, None, SamplingRequest(shift=12.0, **request_values))


@pytest.mark.parametrize("model_name, high, low, refused, kind", [
    ("tiny-wan22-t2v", F.WAN22_I2V_HIGH, F.WAN22_I2V_LOW, F.WAN22_I2V_HIGH, "text-to-video"),
    ("tiny-wan22-i2v", F.WAN22_HIGH, F.WAN22_LOW, F.WAN22_HIGH, "image-to-video"),
])
def test_i2v_files_on_t2v_experts_and_t2v_files_on_i2v_experts_are_refused_naming_both(
        pair, load_tiny, model_name, high, low, refused, kind):
    before = {k: v.clone() for k, v in load_tiny(model_name).components["transformer"].state_dict().items()}
    with pytest.raises(ContractError) as caught:
        pair(model_name, high, low)
    text = str(caught.value)
    assert text.startswith(f"{_basename(refused)} is a") and f"but {model_name} (transformer) is a" in text and kind in text
    after = load_tiny(model_name).components["transformer"].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_swapped_i2v_pair_is_refused_like_the_t2v_one(pair):
    with pytest.raises(LoraBindError, match=f"the pair is swapped\\): {F.WAN22_I2V_LOW} says low noise but goes into "
                                            f"transformer \\(high_noise_lora\\); {F.WAN22_I2V_HIGH} says high"):
        pair("tiny-wan22-i2v", F.WAN22_I2V_LOW, F.WAN22_I2V_HIGH)


def test_the_i2v_pair_accounts_the_image_branch_keys_as_expected(pair):
    reports = pair("tiny-wan22-i2v")["ui"]["lorabind_accounting"]
    for report in reports:
        assert report["counts"]["unmatched"] == 0 and report["counts"]["expected_unmatched"] > 0


@pytest.mark.parametrize("name, boundary", [("tiny-wan22-i2v", 0.9), ("tiny-wan22-t2v", 0.875)])
def test_a_two_expert_folder_without_boundary_ratio_gets_the_published_default(load_tiny, name, boundary):
    model = load_tiny(name)
    bare = dataclasses.replace(model, model_index={k: v for k, v in model.model_index.items()
                                                   if k != "boundary_ratio"})
    family = family_for(bare)
    schedule = SamplingRequest(steps=4, cfg=1.0, shift=5.0)
    assert family.sampling.effective_boundary(bare, schedule) == boundary
    assert family.sampling.effective_boundary(bare, dataclasses.replace(schedule, boundary=0.5)) == 0.5
