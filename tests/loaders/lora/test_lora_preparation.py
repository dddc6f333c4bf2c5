"""``prepare_lora``, the one read -> map -> account entry point: what it returns, the one wording of its
refusals wherever it is called from (binding, nodes, inspect, merge), and the file-name questions beside it."""

import pytest

from lorabind.loaders.binding.bind import bind
from lorabind.loaders.dispatch.contract_discovery import discover_contract
from lorabind.loaders.errors import KeyMatchError
from lorabind.loaders.families import family_for, for_model_family, guess_family
from lorabind.loaders.families.wan.slots import expert_role
from lorabind.loaders.handles import FuseSpec, ModelHandle
from lorabind.loaders.lora.preparation import lora_rank, prepare_lora
from lorabind.nodes.adapter_nodes import FuseDistillLoRA
from lorabind.runtime.commands.inspect import inspect_lora
from lorabind.tiny_models import lora_fixtures as F


def test_prepared_lora_carries_the_targets_that_fit_and_a_named_report(load_tiny, tiny_models_root):
    model = load_tiny("tiny-wan22-t2v")
    path = str(tiny_models_root / "loras" / F.WAN22_LOW)
    prepared = prepare_lora(path, model, "transformer_2", family_for(model), guess_family=guess_family, name=F.WAN22_LOW)
    assert prepared.targets is prepared.accounting.applied and prepared.targets
    modules = dict(model.components["transformer_2"].named_modules())
    assert all(dest in modules for dest in prepared.targets)
    report = prepared.report()
    assert report["lora"] == F.WAN22_LOW and report["component"] == "transformer_2"
    assert report["counts"]["applied"] > 0 and report["counts"]["unmatched"] == 0
    assert prepared.rank == F.FIXTURE_RANK == lora_rank(prepared.lora)


def test_a_missing_component_is_refused_in_the_same_words_by_binding_and_nodes(load_tiny, tiny_models_root,
                                                                                registry):
    model = load_tiny("tiny-wan21-t2v")
    path = str(tiny_models_root / "loras" / F.WAN21_DISTILL)
    words = (f"{F.WAN21_DISTILL} is meant for component 'transformer_2', which model tiny-wan21-t2v (wan2.1) "
             f"does not have (components: transformer)")
    with pytest.raises(KeyMatchError) as direct:
        prepare_lora(path, model, "transformer_2", family_for(model), guess_family=guess_family, name=F.WAN21_DISTILL)
    assert str(direct.value) == words
    with pytest.raises(KeyMatchError) as bound:
        bind(model, [FuseSpec(path=path, strength=1.0, component="transformer_2", name=F.WAN21_DISTILL)], [])
    assert str(bound.value) == words
    with pytest.raises(KeyMatchError) as node:
        FuseDistillLoRA().fuse(ModelHandle(model), F.WAN21_DISTILL, 1.0, "transformer_2")
    assert str(node.value) == "FuseDistillLoRA: " + words


def test_lenient_preparation_keeps_the_strict_refusal_text_that_inspect_reports(load_tiny, tiny_models_root):
    model = load_tiny("tiny-wan21-t2v")
    path = str(tiny_models_root / "loras" / F.QWEN_LIGHTNING)  # a Qwen-Image file on a Wan model
    with pytest.raises(KeyMatchError) as strict:
        prepare_lora(path, model, "transformer", family_for(model), guess_family=guess_family)
    lenient = prepare_lora(path, model, "transformer", family_for(model), guess_family=guess_family, lenient=True)
    assert lenient.accounting.refusal == str(strict.value)
    assert lenient.accounting.unmatched and "match nothing in the transformer (wan2.1)" in lenient.accounting.refusal
    report = inspect_lora(path, model_dir=str(tiny_models_root / "diffusers" / "tiny-wan21-t2v"))
    assert report["accounting"]["refusal"] == str(strict.value)
    assert report["accounting"]["counts"] == lenient.accounting.counts


@pytest.mark.parametrize("name, role", [
    (F.WAN22_HIGH, "high"), (F.WAN22_LOW, "low"),
    ("Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH_fp16.safetensors", "high"),
    ("Wan_2_2_I2V_A14B_LOW_lightx2v_4step_lora_260412_rank_64_fp16.safetensors", "low"),
    ("wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors", "high"),
    (F.WAN21_DISTILL, None), ("lowres_highlights.safetensors", None),
])
def test_expert_role_from_published_file_names(name, role):
    assert expert_role(name) == role


def test_declared_contract_is_off_at_strength_zero(load_tiny, tiny_models_root):
    model = load_tiny("tiny-wan22-t2v")
    path = str(tiny_models_root / "loras" / F.WAN22_HIGH)
    prepared = prepare_lora(path, model, "transformer", family_for(model))
    family = for_model_family(model.family)
    contract = discover_contract(path, F.WAN22_HIGH, family=family, lora=prepared.lora, strength=1.0)
    assert (contract.steps, contract.family) == (4, "wan2.2_moe")
    assert discover_contract(path, F.WAN22_HIGH, family=family, lora=prepared.lora, strength=0.0) is None


SUFFIX_OF_PART = {"down": ".lora_down.weight", "up": ".lora_up.weight", "alpha": ".alpha", "weight": ".diff",
                  "bias": ".diff_b", "scale_shift_table": ".diff_m"}


def test_targets_keep_their_source_keys_grouped_by_part(load_tiny, tiny_models_root):
    """Reading names each key's part, mapping moves it with its part (Wan ``diff_m`` becomes the diff of
    ``scale_shift_table``), and the accounting counts the parts it applied: no key string is parsed again."""
    model = load_tiny("tiny-wan22-t2v")
    prepared = prepare_lora(str(tiny_models_root / "loras" / F.WAN22_HIGH), model, "transformer", family_for(model))
    seen = {}
    for dest, patch in prepared.targets.items():
        assert set(patch.source_keys) <= set(SUFFIX_OF_PART), dest
        for part, keys in patch.source_keys.items():
            assert keys and all(key.endswith(SUFFIX_OF_PART[part]) for key in keys), (dest, part, keys)
            seen[part] = seen.get(part, 0) + len(keys)
        assert set(patch.param_diffs) == set(patch.source_keys) - {"down", "up", "alpha"}, dest
    assert set(seen) == set(SUFFIX_OF_PART)
    assert sum(seen.values()) == prepared.accounting.counts["applied"]
