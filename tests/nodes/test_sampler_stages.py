"""Staged sampling on the tiny models: a run equals a chain of stages, the three-stage Wan2.2 Lightning recipe
samples the slices it was given under per-stage contracts, SIGMAS in and out, and the sigma nodes."""

import os

import pytest
import torch

from adapters_helpers import recorded_forwards
from lorabind.loaders.binding import bind as binding
from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text
from lorabind.loaders.errors import ContractError
from lorabind.loaders.handles import ModelHandle
from lorabind.nodes.adapter_nodes import FuseDistillLoRA, WanMoELoRAPair
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.nodes.sigma_nodes import LoraBindSigmas, LoraBindSplitSigmas
from lorabind.tiny_models import lora_fixtures as F

TABLE = [1.0, 0.9375, 0.833333, 0.625, 0.0]  # lightx2v 4 steps at shift 5 (reference §5.2)
HIGH, LOW = os.path.basename(F.WAN22_HIGH), os.path.basename(F.WAN22_LOW)


@pytest.fixture(scope="module")
def wan22(load_tiny):
    model = load_tiny("tiny-wan22-t2v")
    return ModelHandle(model), encode_text(model, "a cat"), encode_text(model, "blurry"), empty_latent(model, 32, 32, 5)


def _sample(handle, pos, neg, latent, cfg=1.0, **stage):
    return LoraBindSampler().sample(handle, pos, neg, latent, 7, 4, cfg, 5.0, 0.0, True, **stage)


def _fuse(handle, name):
    return FuseDistillLoRA().fuse(handle, name, 1.0)["result"][0]


def test_one_run_equals_a_chain_of_two_stages(wan22, registry):
    handle, pos, neg, _ = wan22
    latent = empty_latent(handle.model, 32, 32, 5)
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    whole, whole_sigmas = _sample(paired, pos, neg, latent)["result"]
    first, first_sigmas = _sample(paired, pos, neg, latent, end_step=3)["result"]
    second, second_sigmas = _sample(paired, pos, neg, first, start_step=3, add_noise=False)["result"]
    assert first_sigmas.tolist() == pytest.approx(TABLE[:4], abs=1e-6)
    assert second_sigmas.tolist() == pytest.approx(TABLE[3:], abs=1e-6)
    assert whole_sigmas.tolist() == pytest.approx(TABLE, abs=1e-6)
    assert (first.samples - whole.samples).abs().max() > 1e-2  # the first stage really stopped with noise left
    torch.testing.assert_close(second.samples, whole.samples, rtol=0, atol=2e-6)


def test_three_stage_lightning_recipe_runs_each_slice_on_its_expert(wan22, registry):
    handle, pos, neg, latent = wan22
    model = handle.model
    with recorded_forwards(model) as calls:
        motion, s1 = _sample(handle, pos, neg, latent, cfg=3.5, end_step=1)["result"]
        high, s2 = _sample(_fuse(handle, F.WAN22_HIGH), pos, neg, motion, start_step=1, end_step=2,
                           add_noise=False)["result"]
        out = _sample(_fuse(handle, F.WAN22_LOW), pos, neg, high, start_step=2, add_noise=False)
    final, s3 = out["result"]
    assert [s.tolist() for s in (s1, s2, s3)] == [pytest.approx(TABLE[a:b], abs=1e-6)
                                                   for a, b in ((0, 2), (1, 3), (2, 5))]
    # stage 1 at cfg 3.5: cond + uncond on the high-noise expert; stages 2 and 3 at cfg 1: one pass per step
    assert [(name, round(t, 1)) for name, t in calls] == [
        ("transformer", 1000.0), ("transformer", 1000.0), ("transformer", 937.5),
        ("transformer_2", 833.3), ("transformer_2", 625.0)]
    assert "stage: steps 2..3 of 4 (add_noise off)" in out["ui"]["text"]
    assert torch.isfinite(final.samples).all() and "lorabind_noise_sigma" not in final.extra


def test_the_middle_stage_past_the_boundary_is_refused_by_name(wan22, registry, monkeypatch):
    handle, pos, neg, latent = wan22
    motion, _ = _sample(handle, pos, neg, latent, cfg=3.5, end_step=1)["result"]
    monkeypatch.setattr(binding, "bind", lambda *a, **k: pytest.fail("bind() ran before the refusal"))
    with pytest.raises(ContractError, match=rf"{HIGH} is a 4-step distill LoRA: end_step 3 runs step 2 "
                                            r"\(σ=0.8333\) on transformer_2, which carries no distill LoRA; .*"
                                            r"steps 0..1 of the schedule\): set end_step to 2"):
        _sample(_fuse(handle, F.WAN22_HIGH), pos, neg, motion, start_step=1, end_step=3, add_noise=False)


def test_the_middle_stage_contract_is_enforced(wan22, registry):
    handle, pos, neg, latent = wan22
    motion, _ = _sample(handle, pos, neg, latent, cfg=3.5, end_step=1)["result"]
    with pytest.raises(ContractError, match=rf"{HIGH} is a 4-step distill LoRA: cfg must be 1, got 3.5"):
        _sample(_fuse(handle, F.WAN22_HIGH), pos, neg, motion, cfg=3.5, start_step=1, end_step=2, add_noise=False)


def test_continuing_at_another_sigma_or_noising_a_noisy_latent_is_refused(wan22, registry):
    handle, pos, neg, latent = wan22
    motion, _ = _sample(handle, pos, neg, latent, cfg=3.5, end_step=1)["result"]
    with pytest.raises(ValueError, match=r"left at sigma 0.9375; this stage starts at sigma 0.8333 \(step 2\)"):
        _sample(handle, pos, neg, motion, start_step=2, add_noise=False)
    with pytest.raises(ValueError, match=r"still holds noise at sigma 0.9375.*turn add_noise off"):
        _sample(handle, pos, neg, motion, start_step=1)


def test_sigmas_input_under_a_contract_must_be_part_of_its_table(wan22, registry):
    handle, pos, neg, latent = wan22
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    float32_table = torch.tensor(TABLE, dtype=torch.float32)  # what ComfyUI's sigma nodes hand over
    ran = _sample(paired, pos, neg, latent, sigmas=float32_table[:3])["result"][1]
    assert ran.tolist() == pytest.approx(TABLE[:3], abs=1e-6)
    with pytest.raises(ContractError, match=rf"{HIGH} is a 4-step distill LoRA: the sigmas input "
                                            r"\[1, 0.9, 0.5, 0\] is no part of its 4-step table"):
        _sample(paired, pos, neg, latent, sigmas=torch.tensor([1.0, 0.9, 0.5, 0.0]))


def test_denoise_runs_the_last_steps_of_a_longer_schedule(wan22):
    handle, pos, neg, latent = wan22
    ran = _sample(handle, pos, neg, latent, denoise=0.5)["result"][1]  # 4 steps of an 8-step schedule
    eight = LoraBindSigmas().sigmas(handle, 8, 5.0)["result"][0]
    assert ran.tolist() == pytest.approx(eight[4:].tolist(), abs=1e-7)


def test_sigma_nodes_give_the_contract_table_and_split_it_at_the_boundary(wan22, registry):
    handle, *_ = wan22
    (paired,) = WanMoELoRAPair().pair(handle, F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    (table,) = LoraBindSigmas().sigmas(paired, 0, 5.0)["result"]
    assert table.tolist() == pytest.approx(TABLE, abs=1e-6)
    first, second, at = LoraBindSplitSigmas().split(table, 1, 0.875)["result"]
    assert at == 2 and first.tolist() == pytest.approx(TABLE[:3], abs=1e-6)
    assert second.tolist() == pytest.approx(TABLE[2:], abs=1e-6)
    with pytest.raises(ContractError, match=rf"{HIGH} is a 4-step distill LoRA: steps must be 4, got 6"):
        LoraBindSigmas().sigmas(paired, 6, 5.0)


def test_the_sigmas_output_is_rebuilt_only_when_the_stage_sigmas_change(wan22):
    """One node instance across runs (as the executor keeps it): a seed-only rerun hands over the same tensor, a
    changed stage a new one with the new values (issue 33: the rebuild was a seed-only rerun's cost)."""
    handle, pos, neg, latent = wan22
    node = LoraBindSampler()
    first = node.sample(handle, pos, neg, latent, 7, 4, 1.0, 5.0, 0.0, True)["result"][1]
    again = node.sample(handle, pos, neg, latent, 8, 4, 1.0, 5.0, 0.0, True)["result"][1]
    stage = node.sample(handle, pos, neg, latent, 8, 4, 1.0, 5.0, 0.0, True, end_step=3)["result"][1]
    assert again is first and first.dtype == torch.float32
    assert stage is not first
    assert first.tolist() == pytest.approx(TABLE, abs=1e-6) and stage.tolist() == pytest.approx(TABLE[:4], abs=1e-6)
    shorter = node.sample(handle, pos, neg, latent, 8, 2, 1.0, 5.0, 0.0, True)["result"][1]
    assert len(shorter) == 3 and shorter is not stage
