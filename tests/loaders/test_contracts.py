"""Contract collection and enforcement (loaders.dispatch.contract_discovery) on hand-made handles: every rule and message."""

from types import SimpleNamespace

import pytest

from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch import contract_discovery as contracts_module
from lorabind.loaders.dispatch.contract_discovery import SamplingRequest, collect_contracts, resolve_schedule
from lorabind.loaders.errors import ContractError
from lorabind.loaders.handles import (
    AdapterHandle,
    AdapterSpec,
    FuseSpec,
    ModelHandle,
    ScheduleContract,
    ScheduleHandle,
)

HIGH = "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"
LOW = "wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors"
# Published lightx2v 4-step schedule (reference lora-formats-and-contracts.md §5.2: k=5, N=4)
PUBLISHED_4STEP = [1.0, 0.9375, 0.833333, 0.625, 0.0]


def distill(source, steps=4, shift=5.0, cfg=1.0, family="wan2.2_moe"):
    return ScheduleContract(source=source, kind="distill", family=family, steps=steps,
                            sigmas=shifted_sigmas(steps, shift), shift=shift, cfg=cfg)


def wan22_handle(*fuse_contract_pairs, family="wan2.2_moe"):
    handle = ModelHandle(model=SimpleNamespace(family=family, name="tiny-wan22-t2v"))
    for (name, component, strength), contract in fuse_contract_pairs:
        spec = FuseSpec(path=f"/models/loras/{name}", strength=strength, component=component, name=name)
        handle = handle.with_fuses(spec, contracts=(contract,) if contract else ())
    return handle


def pair_handle(high_strength=1.0, low_strength=1.0):
    return wan22_handle(((HIGH, "transformer", high_strength), distill(HIGH)),
                        ((LOW, "transformer_2", low_strength), distill(LOW)))


def test_without_contracts_the_schedule_is_the_shifted_grid():
    handle = wan22_handle()
    resolved = resolve_schedule(handle, None, None, SamplingRequest(steps=7, cfg=3.5, shift=3.0))
    assert resolved.sigmas == shifted_sigmas(7, 3.0)
    assert (resolved.steps, resolved.cfg, resolved.shift) == (7, 3.5, 3.0)
    assert resolved.contracts == () and resolved.overrides == ()


def test_high_low_pair_declaring_the_same_contract_resolves_to_the_published_sigmas():
    resolved = resolve_schedule(pair_handle(), None, None, SamplingRequest(steps=4, cfg=1.0, shift=5.0))
    assert resolved.sigmas == pytest.approx(PUBLISHED_4STEP, abs=1e-6)
    assert len(resolved.sigmas) == 5 and resolved.sigmas[-1] == 0.0
    assert [c.source for c in resolved.contracts] == [HIGH, LOW]
    assert resolved.overrides == ()


def test_wrong_steps_is_refused_naming_the_file_and_field():
    with pytest.raises(ContractError) as err:
        resolve_schedule(pair_handle(), None, None, SamplingRequest(steps=20, cfg=1.0, shift=5.0))
    assert str(err.value).startswith(f"{HIGH} is a 4-step distill LoRA: steps must be 4, got 20")


@pytest.mark.parametrize(
    "request_kwargs, expected",
    [
        ({"steps": 4, "cfg": 1.0, "shift": 3.0}, "is a 4-step distill LoRA: shift must be 5, got 3"),
        ({"steps": 4, "cfg": 5.0, "shift": 5.0}, "is a 4-step distill LoRA: cfg must be 1, got 5"),
    ],
)
def test_wrong_shift_or_cfg_is_refused(request_kwargs, expected):
    with pytest.raises(ContractError) as err:
        resolve_schedule(pair_handle(), None, None, SamplingRequest(**request_kwargs))
    assert str(err.value).startswith(f"{HIGH} {expected}")


def test_conflicting_contracts_name_both_artifacts():
    eight = "wan2.2_t2v_lightx2v_8steps_custom_low_noise.safetensors"
    handle = wan22_handle(((HIGH, "transformer", 1.0), distill(HIGH)),
                          ((eight, "transformer_2", 1.0), distill(eight, steps=8)))
    with pytest.raises(ContractError) as err:
        resolve_schedule(handle, None, None, SamplingRequest(steps=4, cfg=1.0, shift=5.0))
    message = str(err.value)
    assert message.startswith("conflicting sampling contracts:")
    assert f"{HIGH} requires steps=4" in message and f"{eight} requires steps=8" in message


def test_two_stacked_adapters_with_conflicting_contracts_name_both():
    four, eight = "Qwen-Image-Lightning-4steps-V1.0.safetensors", "Qwen-Image-Lightning-8steps-V1.1.safetensors"
    adapters = AdapterHandle()
    for name, steps in ((four, 4), (eight, 8)):
        adapters = adapters.stacked(AdapterSpec(path=f"/l/{name}", scale=1.0, name=name),
                                    (distill(name, steps=steps, shift=3.0, family="qwen_image"),))
    handle = ModelHandle(model=SimpleNamespace(family="qwen_image", name="tiny-qwen-image"))
    with pytest.raises(ContractError, match=rf"^conflicting sampling contracts: {four} requires steps=4 but {eight} "
                                            r"requires steps=8; remove one of them$"):
        resolve_schedule(handle, adapters, None, SamplingRequest(steps=4, cfg=1.0, shift=3.0))


def test_a_contract_of_another_family_is_refused_and_wan21_fits_wan22():
    h3 = ScheduleContract(source="minimax_h3_t2va_turbo_4step.safetensors", kind="turbo", family="minimax_h3",
                          steps=4, sigmas=shifted_sigmas(4, 6.0), shift=6.0)
    handle = ModelHandle(model=SimpleNamespace(family="wan2.2_moe", name="tiny-wan22-t2v"))
    with pytest.raises(ContractError, match=r"^minimax_h3_t2va_turbo_4step.safetensors is a minimax_h3 Turbo "
                                            r"adapter; its sampling contract does not apply to the wan2.2_moe "
                                            r"model tiny-wan22-t2v$"):
        resolve_schedule(handle, None, ScheduleHandle(h3), SamplingRequest(steps=4, cfg=1.0, shift=6.0))
    off = resolve_schedule(handle, None, ScheduleHandle(h3), SamplingRequest(4, 1.0, 6.0, enforce_contract=False))
    assert off.overrides[0].endswith("model tiny-wan22-t2v; the request's values are used (enforce_contract is off)")
    wan21 = distill("wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors", family="wan2.1")
    wan22_with_wan21_lora = wan22_handle((("wan21.safetensors", "transformer", 1.0), wan21))
    assert resolve_schedule(wan22_with_wan21_lora, None, None, SamplingRequest(4, 1.0, 5.0)).overrides == ()


def test_schedule_input_with_other_sigmas_conflicts_on_the_sigmas_field():
    manual = ScheduleContract(source="ManualSigmas node 12", kind="manual", family="wan2.2_moe",
                              sigmas=(1.0, 0.8, 0.5, 0.2, 0.0))
    with pytest.raises(ContractError) as err:
        resolve_schedule(pair_handle(), None, ScheduleHandle(manual), SamplingRequest(steps=4, cfg=1.0, shift=5.0))
    message = str(err.value)
    assert f"{HIGH} requires sigmas=[1, 0.9375, 0.833333, 0.625, 0]" in message
    assert "ManualSigmas node 12 requires sigmas=[1, 0.8, 0.5, 0.2, 0]" in message


def test_explicit_sigmas_from_a_schedule_input_are_used_unchanged():
    points = (1.0, 0.8, 0.5, 0.2, 0.0)
    manual = ScheduleContract(source="ManualSigmas", kind="manual", family="wan2.1", sigmas=points)
    resolved = resolve_schedule(wan22_handle(), None, ScheduleHandle(manual), SamplingRequest(4, 1.0, 5.0))
    assert resolved.sigmas == points
    with pytest.raises(ContractError, match="ManualSigmas is a 4-step manual artifact: steps must be 4, got 6"):
        resolve_schedule(wan22_handle(), None, ScheduleHandle(manual), SamplingRequest(6, 1.0, 5.0))


def test_invalid_contract_sigmas_are_refused_naming_the_artifact():
    bad = ScheduleContract(source="bad_schedule.safetensors", kind="distill", family="wan2.1",
                           sigmas=(1.0, 0.5, 0.6, 0.0))
    handle = wan22_handle((("bad_schedule.safetensors", "transformer", 1.0), bad))
    with pytest.raises(ContractError, match=r"bad_schedule.safetensors: schedule .* strictly decreasing"):
        resolve_schedule(handle, None, None, SamplingRequest(3, 1.0, 5.0))


def test_strength_zero_fuse_and_scale_zero_adapter_declare_no_contract():
    handle = pair_handle(high_strength=0.0, low_strength=0.0)
    adapter_contract = distill("turbo_adapter.safetensors", steps=8)
    adapters = AdapterHandle().stacked(AdapterSpec(path="/l/turbo_adapter.safetensors", scale=0.0,
                                                   name="turbo_adapter.safetensors"), (adapter_contract,))
    assert collect_contracts(handle, adapters, None) == ()
    resolved = resolve_schedule(handle, adapters, None, SamplingRequest(steps=20, cfg=5.0, shift=3.0))
    assert resolved.sigmas == shifted_sigmas(20, 3.0) and resolved.contracts == ()


def test_adapter_at_nonzero_scale_contributes_its_contract():
    contract = distill("Qwen-Image-Lightning-4steps-V1.0.safetensors", shift=3.0, family="qwen_image")
    adapters = AdapterHandle().stacked(
        AdapterSpec(path="/l/Qwen-Image-Lightning-4steps-V1.0.safetensors", scale=0.7), (contract,))
    handle = ModelHandle(model=SimpleNamespace(family="qwen_image", name="tiny-qwen-image"))
    with pytest.raises(ContractError, match="Lightning-4steps-V1.0.safetensors is a 4-step distill LoRA: steps must"):
        resolve_schedule(handle, adapters, None, SamplingRequest(steps=8, cfg=1.0, shift=3.0))
    resolved = resolve_schedule(handle, adapters, None, SamplingRequest(steps=4, cfg=1.0, shift=3.0))
    assert resolved.sigmas == shifted_sigmas(4, 3.0)


def test_enforce_contract_off_records_each_override_and_uses_the_request():
    request = SamplingRequest(steps=20, cfg=3.5, shift=5.0, enforce_contract=False)
    resolved = resolve_schedule(pair_handle(), None, None, request)
    assert resolved.sigmas == shifted_sigmas(20, 5.0)
    assert (resolved.steps, resolved.cfg) == (20, 3.5)
    assert resolved.overrides[0] == f"steps=20 overrides {HIGH} (steps=4 in its contract)"
    assert resolved.overrides[1] == f"cfg=3.5 overrides {HIGH} (cfg=1 in its contract)"
    assert resolved.overrides[2].startswith("sigmas=[1, ")
    assert resolved.overrides[2].endswith(f"override {HIGH} (sigmas=[1, 0.9375, 0.833333, 0.625, 0] in its contract)")
    assert len(resolved.overrides) == 3


def test_a_per_expert_cfg_pair_is_checked_value_by_value():
    with pytest.raises(ContractError, match=rf"^{HIGH} is a 4-step distill LoRA: cfg_low_noise must be 1, got 3 "):
        resolve_schedule(pair_handle(), None, None, SamplingRequest(steps=4, cfg=(1.0, 3.0), shift=5.0))
    assert resolve_schedule(pair_handle(), None, None, SamplingRequest(4, (1.0, 1.0), 5.0)).cfg == 1.0
    off = resolve_schedule(pair_handle(), None, None, SamplingRequest(4, (1.0, 3.0), 5.0, enforce_contract=False))
    assert off.cfg == (1.0, 3.0)
    assert off.overrides == (f"cfg_low_noise=3 overrides {HIGH} (cfg=1 in its contract)",)
    assert resolve_schedule(wan22_handle(), None, None, SamplingRequest(4, (4.0, 3.0), 5.0)).cfg == (4.0, 3.0)


@pytest.mark.parametrize("boundary, high_steps", [(0.9, None), (0.95, 1), (0.5, 4)])
def test_an_explicit_boundary_may_not_change_the_pairs_expert_split(boundary, high_steps):
    handle = pair_handle()
    handle = ModelHandle(model=SimpleNamespace(family="wan2.2_moe", name="tiny-wan22-t2v",
                                               model_index={"boundary_ratio": 0.875}),
                         fuses=handle.fuses, contracts=handle.contracts)
    request = SamplingRequest(steps=4, cfg=1.0, shift=5.0, boundary=boundary)
    if high_steps is None:  # 0.9 splits the published sigmas 2 + 2 like 0.875 does
        assert resolve_schedule(handle, None, None, request).boundary == 0.9
        return
    text = (f"boundary={boundary:g} runs {high_steps} of 4 steps on the high-noise expert, but the model's "
            f"boundary_ratio 0.875 runs 2")
    with pytest.raises(ContractError, match=rf"^{HIGH} is a 4-step distill LoRA: {text} \(set boundary to 0"):
        resolve_schedule(handle, None, None, request)
    off = resolve_schedule(handle, None, None, SamplingRequest(4, 1.0, 5.0, boundary=boundary, enforce_contract=False))
    assert off.overrides == (f"{text}; overrides {HIGH}",) and off.boundary == boundary


def test_enforce_contract_off_turns_a_conflict_into_a_recorded_override():
    eight = "other_8step_distill.safetensors"
    handle = wan22_handle(((HIGH, "transformer", 1.0), distill(HIGH)),
                          ((eight, "transformer_2", 1.0), distill(eight, steps=8)))
    resolved = resolve_schedule(handle, None, None, SamplingRequest(6, 1.0, 5.0, enforce_contract=False))
    assert resolved.sigmas == shifted_sigmas(6, 5.0)
    assert any(text.startswith("conflicting sampling contracts:") and eight in text for text in resolved.overrides)


def test_task_outside_the_contract_is_refused():
    contract = ScheduleContract(source="task_bound.safetensors", kind="distill", family="wan2.1", steps=4,
                                shift=5.0, tasks=("t2v",))
    handle = wan22_handle((("task_bound.safetensors", "transformer", 1.0), contract))
    with pytest.raises(ContractError, match=r"serves tasks \['t2v'\], got task=i2v"):
        resolve_schedule(handle, None, None, SamplingRequest(4, 1.0, 5.0, task="i2v"))


def test_minimax_h3_models_delegate_to_the_family_resolver(monkeypatch):
    from lorabind.loaders.families import minimax_h3

    seen = {}
    sentinel = contracts_module.ResolvedSchedule(sigmas=(1.0, 0.0), steps=1, cfg=1.0, shift=12.0)

    def fake_resolve(model_handle, contracts, request):
        seen.update(contracts=contracts, request=request, model=model_handle)
        return sentinel

    monkeypatch.setattr(minimax_h3.FAMILY.contracts, "resolve_schedule", fake_resolve)
    pinned = ScheduleContract(source="tiny-minimax-h3-pinned", kind="pinned", family="minimax_h3",
                              base_schedule=(1.0, 0.7, 0.4, 0.15, 0.0))
    handle = ModelHandle(model=SimpleNamespace(family="minimax_h3", name="tiny-minimax-h3-pinned"),
                         contracts=(pinned,))
    request = SamplingRequest(steps=4, cfg=1.0, shift=12.0)
    assert resolve_schedule(handle, None, None, request) is sentinel
    assert seen == {"contracts": (pinned,), "request": request, "model": handle}


def test_qwen_lightning_contract_steps_come_from_the_file_name():
    from lorabind.loaders.families import for_model_family

    family = for_model_family("qwen_image")
    four = family.contracts.declared_contract("Qwen-Image-Lightning-4steps-V1.0.safetensors", {}, 64)
    eight = family.contracts.declared_contract("Qwen-Image-Lightning-8steps-V1.1.safetensors", {}, 64)
    assert (four.steps, eight.steps) == (4, 8)
    assert four.cfg == 1.0 and len(four.sigmas) == 5 and len(eight.sigmas) == 9
    spec = AdapterSpec(path="/l/Qwen-Image-Lightning-8steps-V1.1.safetensors", scale=1.0)
    handle = ModelHandle(model=SimpleNamespace(family="qwen_image", name="tiny-qwen-image"))
    with pytest.raises(ContractError, match="Qwen-Image-Lightning-8steps-V1.1.safetensors is a 8-step distill LoRA"):
        resolve_schedule(handle, AdapterHandle().stacked(spec, (eight,)), None,
                         SamplingRequest(steps=4, cfg=1.0, shift=eight.shift))
