"""Strength schedules on the tiny Wan models: a constant schedule is the plain strength bit for bit, a fade
binds at every step exactly what a fresh fuse at that step's strength gives, adapters change scale in place, and
unbind after the run restores the base bit-exactly."""

import pytest
import torch

from adapters_helpers import assert_same_state, state_snapshot
from lorabind.loaders.binding.bind import bind, binding_state, unbind
from lorabind.loaders.binding.strength_schedules import StrengthSchedule, parse_strength_schedule
from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text
from lorabind.loaders.handles import FuseSpec, ModelHandle
from lorabind.nodes.adapter_nodes import FuseDistillLoRA, LoadPEFTAdapter, WanMoELoRAPair
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.tiny_models import lora_fixtures as F

FADE_OUT = [1.0, 2 / 3, 1 / 3, 0.0]  # "0:1, 3:0" over 4 steps


@pytest.fixture(scope="module")
def wan21(load_tiny):
    model = load_tiny("tiny-wan21-t2v")
    return ModelHandle(model), encode_text(model, "a cat"), empty_latent(model, 32, 32, 5)


@pytest.fixture(autouse=True)
def _unbound(wan21):
    unbind(wan21[0].model)
    yield
    unbind(wan21[0].model)


def _sample(handle, pos, latent, adapter=None):
    return LoraBindSampler().sample(handle, pos, None, latent, 7, 4, 1.0, 5.0, 0.0, True, adapter=adapter)


def _fused(handle, strength, schedule=""):
    return FuseDistillLoRA().fuse(handle, F.WAN21_DISTILL, strength, strength_schedule=schedule)["result"][0]


def _states_per_forward(model, run):
    """Run ``run()`` and return the denoiser state (a copy) seen by each forward, with the active adapter
    scales."""
    seen = []

    def record(module, args, kwargs):
        scales = sorted(binding_state(model).adapters.active.values())
        seen.append((state_snapshot(model), scales))

    hooks = [module.register_forward_pre_hook(record, with_kwargs=True) for module in model.components.values()]
    try:
        result = run()
    finally:
        for hook in hooks:
            hook.remove()
    return result, seen


def test_a_constant_schedule_is_the_plain_strength_bit_for_bit(wan21, registry):
    handle, pos, latent = wan21
    plain, plain_sigmas = _sample(_fused(handle, 0.75), pos, latent)["result"]
    plain_state = state_snapshot(handle.model)
    for strength, schedule in ((0.75, "1, 1, 1, 1"), (1.0, "0.75, 0.75, 0.75, 0.75"), (1.0, "0:0.75")):
        unbind(handle.model)
        out = _sample(_fused(handle, strength, schedule), pos, latent)
        scheduled, sigmas = out["result"]
        assert torch.equal(scheduled.samples, plain.samples) and torch.equal(sigmas, plain_sigmas), schedule
        assert_same_state(plain_state, handle.model)
        assert out["ui"]["lorabind_schedule"][0]["strength_schedules"][0]["strengths"] == [0.75] * 4


def test_a_fade_binds_at_each_step_what_a_fresh_fuse_at_that_strength_gives(wan21, registry):
    handle, pos, latent = wan21
    model = handle.model
    base = state_snapshot(model)
    fading = _fused(handle, 1.0, "0:1, 3:0")
    out, seen = _states_per_forward(model, lambda: _sample(fading, pos, latent))
    assert out["ui"]["lorabind_schedule"][0]["strength_schedules"][0]["strengths"] == pytest.approx(FADE_OUT)
    assert len(seen) == 4  # cfg 1: one forward per step
    after_run = state_snapshot(model)
    spec = fading.fuses[0]
    for step, (state, _) in enumerate(seen):
        unbind(model)
        bind(model, [FuseSpec(spec.path, FADE_OUT[step], spec.component)], [])
        fresh = state_snapshot(model)
        assert [k for k in fresh if not torch.equal(fresh[k], state[k])] == [], f"step {step}"
    assert [k for k in fresh if not torch.equal(fresh[k], after_run[k])] == []  # after the run: the last step's
    assert any(not torch.equal(seen[0][0][k], base[k]) for k in base)  # step 0 really was patched
    unbind(model)
    assert_same_state(base, model)


def test_the_fade_changes_the_output_and_a_change_rewrites_only_its_loras_layers(load_tiny, registry):
    model = load_tiny("tiny-wan22-t2v")
    unbind(model)
    handle, pos, latent = ModelHandle(model), encode_text(model, "a cat"), empty_latent(model, 32, 32, 5)
    low = FuseDistillLoRA().fuse(handle, F.WAN22_LOW, 1.0)["result"][0]
    constant, _ = _sample(FuseDistillLoRA().fuse(low, F.WAN22_HIGH, 1.0)["result"][0], pos, latent)["result"]
    patcher, stats = binding_state(model).patcher, binding_state(model).stats
    high_params = len([pid for pid in patcher.patched if not pid.startswith(low.fuses[0].component + ":")])
    assert high_params > 0
    written, restored = stats.tensors_written, stats.tensors_restored
    fading = FuseDistillLoRA().fuse(low, F.WAN22_HIGH, 1.0, strength_schedule="1, 0.5, 0.5, 0")["result"][0]
    faded, _ = _sample(fading, pos, latent)["result"]
    assert (faded.samples - constant.samples).abs().max() > 1e-4
    # step 0 is already bound (strength 1), step 1 rewrites the high-noise LoRA's parameters, step 2 binds
    # nothing (0.5 again), step 3 restores them (strength 0); the low-noise LoRA is never touched
    assert (stats.tensors_written - written, stats.tensors_restored - restored) == (high_params, high_params)
    unbind(model)


def test_adapters_change_scale_in_place_per_step(wan21, registry):
    handle, pos, latent = wan21
    model = handle.model
    stats = binding_state(model).stats
    written = (stats.tensors_written, stats.tensors_restored)
    (adapter,) = LoadPEFTAdapter().load(F.PEFT_FOLDER, 0.8, "transformer", strength_schedule="0:1, 3:0")["result"]
    out, seen = _states_per_forward(model, lambda: _sample(handle, pos, latent, adapter))
    assert [scales for _, scales in seen] == [[pytest.approx(0.8 * m)] if m else [] for m in FADE_OUT]
    assert (stats.tensors_written, stats.tensors_restored) == written  # a dynamic adapter writes no base weight
    (plain,) = LoadPEFTAdapter().load(F.PEFT_FOLDER, 0.8, "transformer")["result"]
    (constant,) = LoadPEFTAdapter().load(F.PEFT_FOLDER, 0.8, "transformer", strength_schedule="1,1,1,1")["result"]
    assert torch.equal(_sample(handle, pos, latent, plain)["result"][0].samples,
                       _sample(handle, pos, latent, constant)["result"][0].samples)


def test_a_wan22_pair_fades_both_experts_alike(load_tiny, registry):
    model = load_tiny("tiny-wan22-t2v")
    handle = ModelHandle(model)
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 0.5,
                                      strength_schedule="1, 1, 0.5, 0.5")["result"]
    out = LoraBindSampler().sample(paired, encode_text(model, "a cat"), None, empty_latent(model, 32, 32, 5), 7, 4,
                                   1.0, 5.0, 0.0, True)
    rows = out["ui"]["lorabind_schedule"][0]["strength_schedules"]
    assert [row["strengths"] for row in rows] == [[1.0, 1.0, 0.5, 0.5], [0.5, 0.5, 0.25, 0.25]]
    unbind(model)


@pytest.mark.parametrize("text, steps, message", [
    ("1, 0.5", 4, "gives 2 strengths but the schedule has 4 steps"),
    ("0:1, 4:0", 4, "keyframe at step 4 but the schedule has 4 steps"),
])
def test_a_schedule_that_does_not_fit_the_run_is_refused_before_any_weight(wan21, registry, text, steps, message):
    handle, pos, latent = wan21
    base = state_snapshot(handle.model)
    with pytest.raises(ValueError, match=message):
        _sample(_fused(handle, 1.0, text), pos, latent)
    assert_same_state(base, handle.model)


@pytest.mark.parametrize("text, message", [
    ("1, 0:1", "mixes plain strengths"), ("1, x", "'x' is not a number"), ("3:1, 1:0", "must rise"),
    ("a:1", "needs a step"), ("inf", "finite number"), ("1" * 20_001, "longer than"), ("11", "within"),
    ("²:1", "'²:1' needs a step"), ("٣:1", "needs a step"),
])
def test_bad_schedule_text_is_refused_naming_the_node(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_strength_schedule(text, "FuseDistillLoRA")
    assert str(err.value).startswith("FuseDistillLoRA: strength_schedule")


def test_schedule_forms_expand_to_one_multiplier_per_step():
    assert parse_strength_schedule("", "n") is None
    assert parse_strength_schedule("1, 0.5\n0.25", "n") == StrengthSchedule(per_step=(1.0, 0.5, 0.25))
    keyed = parse_strength_schedule("1:0, 3:1", "n")
    assert keyed.multipliers(6, "x") == [0.0, 0.0, 0.5, 1.0, 1.0, 1.0]  # held before the first and after the last
    assert keyed.describe() == "1:0, 3:1"
