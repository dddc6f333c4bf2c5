"""The adapter nodes called directly: validation without fusing, refusals, IS_CHANGED."""

import os

import pytest

from adapters_helpers import assert_same_state, state_snapshot
from lorabind.loaders.errors import ComponentUnnamedError, KeyMatchError, LoraBindError
from lorabind.loaders.handles import AdapterHandle, ModelHandle
from lorabind.nodes.adapter_nodes import (
    FuseDistillLoRA,
    LoadPEFTAdapter,
    WanMoELoRAPair,
)
from lorabind.tiny_models import lora_fixtures as F


@pytest.fixture
def wan22(load_tiny, registry):
    return ModelHandle(load_tiny("tiny-wan22-t2v"))


@pytest.fixture
def wan21(load_tiny, registry):
    return ModelHandle(load_tiny("tiny-wan21-t2v"))


def test_lora_combos_list_the_fixture_files_and_none(registry):
    choices = WanMoELoRAPair.INPUT_TYPES()["required"]["high_noise_lora"][0]
    assert choices[0] == "None" and F.WAN22_HIGH in choices and F.PEFT_FOLDER in choices
    assert FuseDistillLoRA.INPUT_TYPES()["required"]["lora_name"][0] == choices[1:]


def test_fuse_records_the_fuse_and_contract_without_touching_weights(wan21, load_tiny):
    before = state_snapshot(load_tiny("tiny-wan21-t2v"))
    out = FuseDistillLoRA().fuse(wan21, F.WAN21_DISTILL, 0.8)
    handle = out["result"][0]
    assert wan21.fuses == () and wan21.contracts == ()  # the input handle is unchanged
    assert handle.model is wan21.model
    (spec,) = handle.fuses
    assert (spec.name, spec.strength, spec.component) == (F.WAN21_DISTILL, 0.8, "transformer")
    assert [c.steps for c in handle.contracts] == [4]
    (report,) = out["ui"]["lorabind_accounting"]
    assert report["counts"]["unmatched"] == 0 and report["counts"]["applied"] > 0
    (contract,) = out["ui"]["lorabind_contract"]
    assert (contract["steps"], contract["shift"], contract["cfg"]) == (4, 5.0, 1.0)
    # the file's tensors vs the model parameters they change (a down/up/alpha triple changes one weight)
    assert 0 < report["parameters"] < report["counts"]["applied"]
    assert out["ui"]["text"][0] == (f"{F.WAN21_DISTILL} -> transformer: {report['counts']['applied']} file tensors "
                                    f"change {report['parameters']} model parameters; 0 expected-unmatched, "
                                    f"0 unmatched at strength 0.8")
    assert_same_state(before, load_tiny("tiny-wan21-t2v"))


def test_fuse_at_strength_zero_declares_no_contract(wan21):
    out = FuseDistillLoRA().fuse(wan21, F.WAN21_DISTILL, 0.0)
    assert out["result"][0].contracts == () and out["ui"]["lorabind_contract"] == [{}]


def test_fuse_auto_component_follows_the_file_name_on_wan22(wan22):
    low = FuseDistillLoRA().fuse(wan22, F.WAN22_LOW, 1.0)["result"][0]
    assert low.fuses[0].component == "transformer_2"
    with pytest.raises(ComponentUnnamedError, match=f"{F.WAN21_DISTILL} does not say which expert.*"
                       "\\(model tiny-wan22-t2v\\), or use WanMoELoRAPair$"):
        FuseDistillLoRA().fuse(wan22, F.WAN21_DISTILL, 1.0)
    forced = FuseDistillLoRA().fuse(wan22, F.WAN21_DISTILL, 1.0, component="transformer")["result"][0]
    assert forced.fuses[0].component == "transformer"


def test_fuse_refuses_a_lora_of_another_family_naming_the_file(registry, load_tiny):
    qwen = ModelHandle(load_tiny("tiny-qwen-image"))
    with pytest.raises(KeyMatchError, match=os.path.basename(F.WAN21_DISTILL)):
        FuseDistillLoRA().fuse(qwen, F.WAN21_DISTILL, 1.0)


def test_wan_pair_puts_high_on_transformer_and_low_on_transformer_2(wan22, load_tiny):
    before = state_snapshot(load_tiny("tiny-wan22-t2v"))
    out = WanMoELoRAPair().pair(wan22, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 0.7)
    handle = out["result"][0]
    assert [(s.name, s.component, s.strength) for s in handle.fuses] == [
        (F.WAN22_HIGH, "transformer", 1.0), (F.WAN22_LOW, "transformer_2", 0.7)]
    assert [c.source for c in handle.contracts] == [os.path.basename(F.WAN22_HIGH),
                                                    os.path.basename(F.WAN22_LOW)]
    assert all(c.steps == 4 and c.shift == 5.0 and c.cfg == 1.0 for c in handle.contracts)
    assert [r["component"] for r in out["ui"]["lorabind_accounting"]] == ["transformer", "transformer_2"]
    assert_same_state(before, load_tiny("tiny-wan22-t2v"))


def test_wan_pair_with_one_side_none(wan22):
    out = WanMoELoRAPair().pair(wan22, "None", 1.0, F.WAN22_LOW, 1.0)
    assert [s.component for s in out["result"][0].fuses] == ["transformer_2"]
    assert out["ui"]["text"][0] == "high_noise_lora: none"
    assert WanMoELoRAPair().pair(wan22, "None", 1.0, "None", 1.0)["result"][0] is wan22


def test_wan_pair_refuses_swapped_files_naming_both(wan22):
    with pytest.raises(LoraBindError) as err:
        WanMoELoRAPair().pair(wan22, F.WAN22_LOW, 1.0, F.WAN22_HIGH, 1.0)
    message = str(err.value)
    assert "wrong slots (the pair is swapped)" in message
    assert f"{F.WAN22_LOW} says low noise but goes into transformer (high_noise_lora)" in message
    assert f"{F.WAN22_HIGH} says high noise but goes into transformer_2 (low_noise_lora)" in message


def test_wan_pair_refuses_a_wan21_model(wan21):
    with pytest.raises(LoraBindError) as err:
        WanMoELoRAPair().pair(wan21, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)
    assert "needs a Wan2.2 MoE model" in str(err.value) and "tiny-wan21-t2v is a wan2.1 model" in str(err.value)


def test_peft_adapters_stack_and_keep_their_scales(registry):
    first = LoadPEFTAdapter().load(F.PEFT_FOLDER, 1.0)["result"][0]
    second = LoadPEFTAdapter().load(F.PEFT_FOLDER, 0.5, component="transformer", adapter=first)["result"][0]
    assert isinstance(second, AdapterHandle) and first.adapters == second.adapters[:1]
    assert [(a.name, a.scale, a.component) for a in second.adapters] == [
        (F.PEFT_FOLDER, 1.0, "transformer"), (F.PEFT_FOLDER, 0.5, "transformer")]
    assert second.contracts == ()


def test_peft_loader_accepts_a_single_lora_file(registry, tiny_models_root):
    from safetensors.torch import load_file, save_file

    folder = tiny_models_root / "loras" / F.PEFT_FOLDER
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    single = "tiny_single_file_lora.safetensors"
    save_file({k.replace("base_model.model.", "transformer."): v for k, v in tensors.items()},
              str(tiny_models_root / "loras" / single))
    out = LoadPEFTAdapter().load(single, 0.25)
    (spec,) = out["result"][0].adapters
    assert (spec.name, spec.scale, spec.path) == (single, 0.25, str(tiny_models_root / "loras" / single))
    assert out["ui"]["text"] == [f"{single} (diffusers) at scale 0.25 on transformer"]


def test_peft_loader_refuses_a_file_with_full_diffs(registry):
    with pytest.raises(LoraBindError, match="FuseDistillLoRA"):
        LoadPEFTAdapter().load(F.WAN21_DISTILL, 1.0)


def test_unknown_lora_name_is_refused_naming_node_and_input(wan21):
    with pytest.raises(LoraBindError, match="FuseDistillLoRA: lora_name 'missing.safetensors' is not in the loras"):
        FuseDistillLoRA().fuse(wan21, "missing.safetensors", 1.0)


def test_is_changed_follows_file_identity(registry, tiny_models_root):
    path = tiny_models_root / "loras" / F.WAN21_DISTILL
    first = FuseDistillLoRA.IS_CHANGED(lora_name=F.WAN21_DISTILL, strength=1.0)
    assert FuseDistillLoRA.IS_CHANGED(lora_name=F.WAN21_DISTILL, strength=0.5) == first
    stat = path.stat()
    try:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        assert FuseDistillLoRA.IS_CHANGED(lora_name=F.WAN21_DISTILL) != first
    finally:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    pair = WanMoELoRAPair.IS_CHANGED(high_noise_lora=F.WAN22_HIGH, low_noise_lora="None")
    assert pair.endswith("|None") and pair != WanMoELoRAPair.IS_CHANGED(high_noise_lora=F.WAN22_LOW,
                                                                         low_noise_lora="None")
    assert LoadPEFTAdapter.IS_CHANGED(lora_name="gone.safetensors") == "missing:gone.safetensors"
