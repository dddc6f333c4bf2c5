"""LoraBindSampler called directly on the tiny models: its SIGMAS output, per-expert guidance (cfg_low_noise)
under contracts, and input mismatches refused before bind() writes anything."""

import dataclasses
import os

import pytest
import torch

from adapters_helpers import recorded_forwards
from lorabind.loaders.binding import bind as binding
from lorabind.loaders.dispatch import generation_steps as generation
from lorabind.loaders.dispatch.contract_discovery import ResolvedSchedule
from lorabind.loaders.errors import ContractError
from lorabind.loaders.families import family_for
from lorabind.nodes.adapter_nodes import WanMoELoRAPair
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.tiny_models import lora_fixtures as F

PUBLISHED_4STEP = [1.0, 0.9375, 0.833333, 0.625, 0.0]  # reference §5.2 (k=5, N=4)


@pytest.fixture(scope="module")
def inputs(tiny_sampler_inputs):
    return tiny_sampler_inputs


def _sample(handle, pos, neg, latent, steps=4, cfg=1.0, shift=5.0, boundary=0.0, **optional):
    return LoraBindSampler().sample(handle, pos, neg, latent, 0, steps, cfg, shift, boundary, True, **optional)


def _forwards(model, run):
    """Run ``run()`` with hooks on every denoiser; return [(component, timestep)] per forward."""
    with recorded_forwards(model) as calls:
        run()
    return [(name, round(t, 3)) for name, t in calls]


@pytest.mark.slow
def test_sigmas_output_is_comfyui_sigmas_of_the_schedule_that_ran(inputs, registry):
    handle, pos, neg, latent = inputs["tiny-wan22-t2v"]
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    out = _sample(paired, pos, neg, latent)
    samples, sigmas = out["result"]
    assert LoraBindSampler.RETURN_TYPES == ("LORABIND_LATENT", "SIGMAS")
    assert sigmas.dtype == torch.float32 and sigmas.dim() == 1 and sigmas[-1].item() == 0.0
    assert sigmas.tolist() == pytest.approx(PUBLISHED_4STEP, abs=1e-6)
    assert sigmas.tolist() == pytest.approx(out["ui"]["lorabind_schedule"][0]["sigmas"])
    assert samples.samples.shape == latent.samples.shape


@pytest.mark.slow
def test_cfg_low_noise_guides_each_wan22_expert_separately(inputs):
    handle, pos, neg, latent = inputs["tiny-wan22-t2v"]
    model = handle.model
    calls = _forwards(model, lambda: _sample(handle, pos, neg, latent, cfg=1.0, cfg_low_noise=3.0))
    per_step = {}
    for name, t in calls:
        per_step.setdefault(t, []).append(name)
    # shift 5, 4 steps: t = 1000, 937.5 on the high-noise expert (cfg 1: one pass), 833.3, 625 on the low one
    # (cfg 3: conditional + unconditional passes)
    assert list(per_step.values()) == [["transformer"], ["transformer"], ["transformer_2"] * 2,
                                       ["transformer_2"] * 2]
    report = _sample(handle, pos, neg, latent, cfg=1.0, cfg_low_noise=3.0)["ui"]["lorabind_schedule"][0]
    assert report["cfg"] == [1.0, 3.0]


def test_a_distill_pair_refuses_a_low_noise_cfg_naming_the_input(inputs, registry, monkeypatch):
    handle, pos, neg, latent = inputs["tiny-wan22-t2v"]
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    monkeypatch.setattr(binding, "bind", lambda *a, **k: pytest.fail("bind() ran before the refusal"))
    with pytest.raises(ContractError, match=rf"{os.path.basename(F.WAN22_HIGH)} is a 4-step distill LoRA: cfg_low_noise must be 1, "
                                            r"got 3 "):
        _sample(paired, pos, neg, latent, cfg=1.0, cfg_low_noise=3.0)


@pytest.mark.parametrize("field, value", [("cfg_low_noise", 2.0), ("boundary", 0.9)])
def test_expert_inputs_on_a_single_expert_model_are_refused(inputs, field, value):
    handle, pos, neg, latent = inputs["tiny-wan21-t2v"]
    with pytest.raises(ValueError, match=rf"{field} is only for Wan2.2 MoE models.*tiny-wan21-t2v is wan2.1: "
                                         rf"set {field} to 0"):
        _sample(handle, pos, neg, latent, **{field: value})


@pytest.mark.parametrize("field", ["positive", "latent"])
def test_inputs_of_another_family_are_refused_before_binding(inputs, monkeypatch, field):
    handle, pos, neg, latent = inputs["tiny-wan22-t2v"]
    _, qwen_pos, _, qwen_latent = inputs["tiny-qwen-image"]
    mixed = {"positive": pos, "negative": neg, "latent": latent,
             field: qwen_pos if field == "positive" else qwen_latent}
    monkeypatch.setattr(binding, "bind", lambda *a, **k: pytest.fail("bind() ran before the refusal"))
    with pytest.raises(ValueError, match=rf"^{field} was made for a qwen_image model but the model "
                                         r"'tiny-wan22-t2v' is wan2.2_moe"):
        _sample(handle, mixed["positive"], mixed["negative"], mixed["latent"])


def test_a_moe_model_without_boundary_ratio_uses_the_published_t2v_boundary(inputs):
    handle, pos, neg, latent = inputs["tiny-wan22-t2v"]
    index = {k: v for k, v in handle.model.model_index.items() if k != "boundary_ratio"}
    no_boundary = dataclasses.replace(handle.model, model_index=index)
    schedule = ResolvedSchedule(sigmas=tuple(PUBLISHED_4STEP), steps=4, cfg=1.0, shift=5.0)
    generation.check_inputs(no_boundary, pos, neg, latent, schedule)
    assert family_for(no_boundary).sampling.effective_boundary(no_boundary, schedule) == 0.875
    assert family_for(no_boundary).sampling.experts_per_step(no_boundary, schedule) == ["transformer"] * 2 + ["transformer_2"] * 2
    explicit = dataclasses.replace(schedule, boundary=0.95)  # an explicit input still wins
    assert family_for(no_boundary).sampling.experts_per_step(no_boundary, explicit) == ["transformer"] + ["transformer_2"] * 3
