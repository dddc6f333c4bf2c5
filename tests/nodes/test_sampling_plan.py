"""The sampler's kept plan: a seed-only rerun reuses the resolved schedule, anything else resolves again, a refusal
still comes before any weight is bound, and a kept plan never keeps a model alive."""

import gc
import weakref

import pytest
import torch

from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text
from lorabind.loaders.errors import ContractError
from lorabind.loaders.handles import ModelHandle
from lorabind.nodes.adapter_nodes import WanMoELoRAPair
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.tiny_models import lora_fixtures as F
from lorabind.usecases import sampling


@pytest.fixture(scope="module")
def wan22(load_tiny):
    model = load_tiny("tiny-wan22-t2v")
    return ModelHandle(model), encode_text(model, "a cat"), encode_text(model, "blurry"), empty_latent(model, 32, 32, 5)


@pytest.fixture
def resolutions(monkeypatch):
    """How many times the sampler resolved a schedule (the work a kept plan saves)."""
    calls = []
    original = sampling.resolve_schedule

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(sampling, "resolve_schedule", counting)
    return calls


def _run(node, handle, pos, neg, latent, seed=7, steps=4, cfg=5.0, shift=5.0, **optional):
    return node.sample(handle, pos, neg, latent, seed, steps, cfg, shift, 0.0, True, **optional)


def test_a_seed_only_rerun_reuses_the_plan_and_still_samples_its_own_noise(wan22, resolutions):
    handle, pos, neg, latent = wan22
    node = LoraBindSampler()
    first = _run(node, handle, pos, neg, latent, seed=1)
    plan = node._plan
    second = _run(node, handle, pos, neg, latent, seed=2)
    again = _run(node, handle, pos, neg, latent, seed=1)
    assert node._plan is plan and len(resolutions) == 1
    assert second["ui"]["lorabind_schedule"][0]["sigmas"] == first["ui"]["lorabind_schedule"][0]["sigmas"]
    assert (first["result"][0].samples - second["result"][0].samples).abs().max() > 1e-2
    torch.testing.assert_close(again["result"][0].samples, first["result"][0].samples, rtol=0, atol=0)
    # the report is the run's own: a change to one run's UI output does not show in the next
    second["ui"]["lorabind_schedule"][0]["steps"] = 99
    assert _run(node, handle, pos, neg, latent, seed=3)["ui"]["lorabind_schedule"][0]["steps"] == 4


@pytest.mark.parametrize("change", [{"steps": 3}, {"cfg": 4.0}, {"shift": 3.0}, {"end_step": 2}])
def test_any_other_option_resolves_a_new_plan(wan22, resolutions, change):
    handle, pos, neg, latent = wan22
    node = LoraBindSampler()
    _run(node, handle, pos, neg, latent)
    plan = node._plan
    out = _run(node, handle, pos, neg, latent, **change)
    assert node._plan is not plan and len(resolutions) == 2
    report = out["ui"]["lorabind_schedule"][0]
    expected = {"steps": ("steps", 3), "cfg": ("cfg", 4.0), "shift": ("shift", 3.0), "end_step": ("end_step", 2)}
    field, value = expected[next(iter(change))]
    assert report[field] == value


def test_new_handles_resolve_a_new_plan_and_a_contract_still_refuses_before_binding(wan22, resolutions,
                                                                                  registry, monkeypatch):
    handle, pos, neg, latent = wan22
    node = LoraBindSampler()
    _run(node, handle, pos, neg, latent, cfg=1.0)
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    _run(node, paired, pos, neg, latent, cfg=1.0)  # the distill pair's 4-step contract holds
    assert len(resolutions) == 2
    kept = node._plan
    binds = []
    monkeypatch.setattr("lorabind.loaders.binding.strength_schedules.bind", lambda *a, **k: binds.append(a))
    with pytest.raises(ContractError, match="steps"):
        _run(node, paired, pos, neg, latent, steps=6, cfg=1.0)
    assert binds == [] and node._plan is kept  # refused before binding; the last good plan stays


def test_the_text_of_a_kept_plan_is_the_text_a_fresh_sampler_writes(wan22, registry):
    handle, pos, neg, latent = wan22
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    node = LoraBindSampler()
    first = _run(node, paired, pos, neg, latent, seed=1, cfg=1.0)["ui"]["text"]
    kept = _run(node, paired, pos, neg, latent, seed=2, cfg=1.0)["ui"]["text"]
    fresh = _run(LoraBindSampler(), paired, pos, neg, latent, seed=2, cfg=1.0)["ui"]["text"]
    assert kept == fresh and kept[0] == first[0]  # bind lines may differ: the first run may have fused
    assert any(line.startswith("contract enforced: ") for line in kept)
    lenient = node.sample(paired, pos, neg, latent, 3, 4, 1.0, 5.0, 0.0, False)["ui"]["text"]
    assert any(line.startswith("contract: ") for line in lenient)
    assert not any(line.startswith("contract enforced") for line in lenient)


def test_a_kept_plan_holds_its_handles_weakly(wan22):
    handle, pos, neg, latent = wan22
    fresh = ModelHandle(handle.model)
    plan = sampling.plan_sampling(fresh, pos, neg, latent, sampling.SampleOptions(seed=0, steps=4, cfg=5.0, shift=5.0))
    gone = weakref.ref(fresh)
    del fresh
    gc.collect()
    assert gone() is None and plan.handles[0]() is None
    other = ModelHandle(handle.model)
    assert not plan.made_from((other, pos, neg, latent, None, None), plan.options)
