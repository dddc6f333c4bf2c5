"""``resolve_schedule`` rules: pinned, Turbo, native, scale 0, task/partition, overrides — each mismatch named."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lorabind.loaders.contracts.sigmas import shift_schedule, shifted_sigmas
from lorabind.loaders.dispatch.contract_discovery import SamplingRequest
from lorabind.loaders.errors import ContractError
from lorabind.loaders.families.minimax_h3 import contracts as mm
from lorabind.loaders.families.minimax_h3.resolve import resolve
from lorabind.loaders.handles import AdapterSpec, FuseSpec

T4_768 = "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors"
T8_544 = "minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors"
R4 = "minimax_h3_ref2v_turbo_4step_v0.1_bf16.safetensors"
NATIVE = "minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors"
NATIVE_META = {"key_format": "minimax-h3-native", "qkv_layout": "grouped", "lora_rank": "4", "lora_alpha": "4",
               "tasks": "t2va", "base_schedule": "1.0,0.7,0.4,0.15,0.0"}
BASE = (1.0, 0.7, 0.4, 0.15, 0.0)
PINNED_INDEX = {"_minimax_h3": {"tasks": ["t2va", "fl2va"], "sigma_shift_scales": {"video": 12, "audio": 3},
                                "base_schedule": list(BASE)}}


@pytest.fixture
def fake_model():
    """A model stand-in for resolver tests: name, model_index, components (the partitions that exist)."""

    def make(model_index=None, partitions=("transformer", "transformer_ref"), name="tiny-minimax-h3"):
        model = SimpleNamespace(name=name, family="minimax_h3", model_index=model_index or {},
                                components={p: object() for p in partitions})
        return SimpleNamespace(model=model, family="minimax_h3", adapters=(), contracts=())

    return make


def turbo(name, scale=1.0, task=None):
    return mm.with_scale(mm.declared_contract(name, {}, 4), scale, task)


def native(scale=1.0):
    return mm.with_scale(mm.declared_contract(NATIVE, NATIVE_META, 4), scale)


def req(steps=0, shift=0.0, audio_shift=None, task=None, enforce=True, cfg=1.0):
    return SamplingRequest(steps=steps, cfg=cfg, shift=shift, audio_shift=audio_shift, task=task,
                           enforce_contract=enforce)


def test_pinned_checkpoint_uses_its_schedule_and_steps_default_to_the_interval_count(fake_model):
    handle = fake_model(PINNED_INDEX, name="tiny-minimax-h3-pinned")
    pinned = mm.checkpoint_contract(PINNED_INDEX, "tiny-minimax-h3-pinned")
    for steps in (0, 4):
        resolved = resolve((pinned,), req(steps=steps), handle)
        assert resolved.steps == 4 and resolved.sigmas == shift_schedule(BASE, 12.0)
        assert resolved.audio_sigmas == shift_schedule(BASE, 3.0) and resolved.task == "t2va"


def test_pinned_checkpoint_rejects_other_step_counts(fake_model):
    handle = fake_model(PINNED_INDEX, name="tiny-minimax-h3-pinned")
    pinned = mm.checkpoint_contract(PINNED_INDEX, "tiny-minimax-h3-pinned")
    with pytest.raises(ContractError) as err:
        resolve((pinned,), req(steps=5), handle)
    assert str(err.value) == ("tiny-minimax-h3-pinned pins a distilled sigma schedule (base_schedule "
                              "[1.0, 0.7, 0.4, 0.15, 0.0]); steps must be 4 or omitted, got 5: steps counts "
                              "intervals, and its 5 sigma points produce 4 denoiser evaluations")


def test_pinned_schedule_does_not_force_ref2va_on_transformer_ref(fake_model):
    handle = fake_model(PINNED_INDEX, name="tiny-minimax-h3-pinned")
    pinned = mm.checkpoint_contract(PINNED_INDEX, "tiny-minimax-h3-pinned")
    resolved = resolve((pinned,), req(steps=6, task="ref2va"), handle)
    assert resolved.steps == 6 and resolved.sigmas == shifted_sigmas(6, 12.0)


@pytest.mark.parametrize("name, steps, shift", [(T4_768, 4, 6.0), (T8_544, 8, 12.0)])
def test_turbo_resolves_to_its_own_video_and_audio_schedules(fake_model, name, steps, shift):
    resolved = resolve((turbo(name),), req(steps=steps, shift=shift, audio_shift=3.0), fake_model())
    assert resolved.sigmas == shifted_sigmas(steps, shift) and resolved.audio_sigmas == shifted_sigmas(steps, 3.0)
    assert resolved.steps == steps and resolved.shift == shift and resolved.overrides == ()


def test_turbo_steps_mismatch_explains_points_versus_evaluations(fake_model):
    with pytest.raises(ContractError) as err:
        resolve((turbo(T4_768),), req(steps=5), fake_model())
    assert str(err.value) == (f"{T4_768} is a 4-step artifact and requires steps=4 (5 sigma points produce 4 "
                              f"denoiser evaluations), got steps=5")


@pytest.mark.parametrize("request_kwargs, message", [
    ({"steps": 4, "shift": 12.0}, f"{T4_768} requires flow_shift=6, got flow_shift=12"),
    ({"steps": 4, "shift": 6.0, "audio_shift": 5.0}, f"{T4_768} requires audio_flow_shift=3, got audio_flow_shift=5"),
    ({"steps": 4, "task": "ref2va"}, f"{T4_768} is a fl2v Turbo artifact and serves tasks ['t2va', 'fl2va'], "
                                     f"got task='ref2va'"),
])
def test_turbo_field_mismatches_name_artifact_and_field(fake_model, request_kwargs, message):
    with pytest.raises(ContractError) as err:
        resolve((turbo(T4_768),), req(**request_kwargs), fake_model())
    assert str(err.value).startswith(message)


def test_ref2v_turbo_serves_ref2va_on_transformer_ref_only(fake_model):
    resolved = resolve((turbo(R4, task="ref2va"),), req(), fake_model())
    assert resolved.task == "ref2va" and resolved.steps == 4
    with pytest.raises(ContractError, match=r"ref2v Turbo artifact and serves tasks \['ref2va'\], got task='t2va'"):
        resolve((turbo(R4),), req(task="t2va"), fake_model())
    with pytest.raises(ContractError, match=f"has no transformer_ref partition, which task='ref2va' runs on "
                                            f"\\(the task {R4} serves\\)"):
        resolve((turbo(R4, task="ref2va"),), req(), fake_model(partitions=("transformer",)))


def test_adapter_attached_to_the_wrong_partition_is_rejected(fake_model):
    handle = fake_model()
    handle.adapters = (AdapterSpec(f"/loras/{R4}", 1.0, component="transformer", name=R4),)
    with pytest.raises(ContractError, match=f"{R4} is attached to transformer, but its contract binds it to "
                                            f"transformer_ref"):
        resolve((turbo(R4, task="ref2va"),), req(), handle)


def test_ref2v_file_fused_into_transformer_is_rejected(fake_model):
    """FuseDistillLoRA puts a file on transformer unless told otherwise; a Ref2VA artifact there binds nothing
    Ref2VA runs on."""
    handle = fake_model()
    handle.fuses = (FuseSpec(f"/loras/turbo/{R4}", 1.0, component="transformer", name=f"turbo/{R4}"),)
    with pytest.raises(ContractError) as err:
        resolve((turbo(f"turbo/{R4}", task="ref2va"),), req(), handle)
    assert str(err.value) == (f"{R4} is fused into transformer, but its contract binds it to transformer_ref "
                              f"(the partition that runs ref2va)")
    handle.fuses = (FuseSpec(f"/loras/{R4}", 1.0, component="transformer_ref", name=R4),)
    assert resolve((turbo(R4, task="ref2va"),), req(), handle).task == "ref2va"


def test_eight_step_message_reads_an_8_step(fake_model):
    with pytest.raises(ContractError) as err:
        resolve((turbo(T8_544),), req(steps=9), fake_model())
    assert str(err.value).startswith(f"{T8_544} is an 8-step artifact and requires steps=8 (9 sigma points produce "
                                     f"8 denoiser evaluations), got steps=9")


def test_native_overrides_the_default_schedule_and_steps_are_intervals(fake_model):
    resolved = resolve((native(),), req(), fake_model())
    assert resolved.steps == 4 and resolved.sigmas == shift_schedule(BASE, 12.0)
    assert resolved.audio_sigmas == shift_schedule(BASE, 3.0)
    with pytest.raises(ContractError) as err:
        resolve((native(),), req(steps=5), fake_model())
    text = str(err.value)
    assert text.startswith(f"{NATIVE} uses the distilled interval-count contract: steps must be 4 or omitted, not 5")
    assert "5 sigma points, i.e. 4 intervals = 4 denoiser evaluations" in text
    with pytest.raises(ContractError, match=r"requires steps=4 \(one denoiser evaluation per base_schedule"):
        resolve((native(),), req(steps=8), fake_model())
    with pytest.raises(ContractError, match=r"supports tasks \['t2va'\] only, got task='fl2va'"):
        resolve((native(),), req(task="fl2va"), fake_model())


def test_native_on_a_pinned_checkpoint_runs_the_adapter_schedule_and_says_why(fake_model):
    """The guide: an active native adapter's base_schedule overrides the checkpoint's pinned one."""
    own = (1.0, 0.8, 0.5, 0.2, 0.0)  # differs from the pinned BASE, so the winner is visible in the sigmas
    adapter = mm.with_scale(mm.declared_contract(NATIVE, {**NATIVE_META, "base_schedule": "1.0,0.8,0.5,0.2,0.0"}, 4),
                            1.0)
    pinned = mm.checkpoint_contract(PINNED_INDEX, "tiny-minimax-h3-pinned")
    model = fake_model(PINNED_INDEX, name="tiny-minimax-h3-pinned")
    resolved = resolve((pinned, mm.on_checkpoint(adapter, PINNED_INDEX)), req(), model)
    assert resolved.steps == 4
    assert resolved.sigmas == shift_schedule(own, 12.0) and resolved.audio_sigmas == shift_schedule(own, 3.0)
    assert resolved.notes == (
        f"schedule of {NATIVE} (native LoRA, base_schedule {list(own)}) overrides tiny-minimax-h3-pinned's pinned "
        f"base_schedule {list(BASE)}: an active native adapter's own schedule wins over the checkpoint's",)
    off = resolve((pinned, mm.with_scale(adapter, 0.0)), req(), model)  # scale 0: the pin is back
    assert off.sigmas == shift_schedule(BASE, 12.0) and off.notes == ()


def test_scale_zero_means_no_contract(fake_model):
    resolved = resolve((turbo(T4_768, scale=0.0),), req(steps=20, shift=5.0), fake_model())
    assert resolved.steps == 20 and resolved.sigmas == shifted_sigmas(20, 5.0) and resolved.contracts == ()
    pinned = mm.checkpoint_contract(PINNED_INDEX, "p")
    resolved = resolve((pinned, native(scale=0.0)), req(), fake_model(PINNED_INDEX, name="p"))
    assert resolved.contracts == (pinned,)


def test_two_different_turbo_schedules_conflict(fake_model):
    with pytest.raises(ContractError, match=f"{T4_768} .* and {T8_544} .* declare different sampling schedules"):
        resolve((turbo(T4_768), turbo(T8_544)), req(), fake_model())


def test_enforce_contract_off_records_each_override(fake_model):
    resolved = resolve((turbo(T4_768),), req(steps=8, shift=5.0, enforce=False), fake_model())
    assert resolved.steps == 8 and resolved.sigmas == shifted_sigmas(8, 5.0)
    assert len(resolved.overrides) == 2
    assert resolved.overrides[0].startswith(f"{T4_768} is a 4-step artifact and requires steps=4")
    assert "requires flow_shift=6, got flow_shift=5" in resolved.overrides[1]


def test_no_contract_needs_explicit_steps_and_uses_checkpoint_shifts(fake_model):
    resolved = resolve((), req(steps=3), fake_model())
    assert resolved.sigmas == shifted_sigmas(3, 12.0) and resolved.audio_sigmas == shifted_sigmas(3, 3.0)
    with pytest.raises(ContractError, match="steps must be at least 1"):
        resolve((), req(steps=0), fake_model())
