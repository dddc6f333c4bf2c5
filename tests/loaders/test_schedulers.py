"""diffusers' flow schedulers stepped over our explicit sigmas: parity with WanPipeline's own UniPC loop, the
scheduler a contract pins, and the family's reference default."""

import os

import pytest
import torch

from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text
from lorabind.loaders.errors import ContractError
from lorabind.loaders.generation.sampling import initial_noise
from lorabind.loaders.generation.schedulers import make_scheduler, resolve_scheduler
from lorabind.loaders.handles import ModelHandle
from lorabind.nodes.adapter_nodes import WanMoELoRAPair
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.tiny_models import lora_fixtures as F

STEPS, CFG, SEED = 6, 4.0, 11


@pytest.fixture(scope="module")
def wan21(load_tiny):
    model = load_tiny("tiny-wan21-t2v")
    return ModelHandle(model), encode_text(model, "a cat"), encode_text(model, "blurry"), empty_latent(model, 32, 32, 5)


def _pipeline_sigmas(model) -> list:
    """The schedule WanPipeline runs: its UniPC scheduler set for STEPS (diffusers moves the first point 1e-6
    below 1 for its own maths; the schedule it starts from is 1)."""
    scheduler = make_scheduler("unipc", model.pipeline.scheduler.config)
    scheduler.set_timesteps(STEPS)
    points = scheduler.sigmas.tolist()
    return [1.0] + points[1:]


def test_unipc_over_the_pipelines_sigmas_equals_wan_pipeline(wan21):
    handle, pos, neg, latent = wan21
    model = handle.model
    sigmas = torch.tensor(_pipeline_sigmas(model), dtype=torch.float32)
    ours, ran = LoraBindSampler().sample(handle, pos, neg, latent, SEED, STEPS, CFG, 5.0, 0.0, True, sigmas=sigmas,
                                         scheduler="unipc")["result"]
    assert len(ran) == STEPS + 1
    with torch.no_grad():
        reference = model.pipeline(prompt_embeds=pos.embeds, negative_prompt_embeds=neg.embeds, height=32, width=32,
                                   num_frames=5, num_inference_steps=STEPS, guidance_scale=CFG, output_type="latent",
                                   latents=initial_noise(latent.samples.shape, SEED)).frames
    assert (ours.samples - latent.samples).abs().max() > 0.1  # it sampled something
    torch.testing.assert_close(ours.samples, reference.float().cpu(), rtol=0, atol=2e-5)


def test_unipc_and_dpmpp_differ_from_euler_on_the_same_sigmas(wan21):
    handle, pos, neg, latent = wan21
    outs = {name: LoraBindSampler().sample(handle, pos, neg, latent, SEED, STEPS, CFG, 5.0, 0.0, True,
                                           scheduler=name)["result"][0].samples
            for name in ("euler", "unipc", "dpmpp_2m")}
    assert all(torch.isfinite(x).all() for x in outs.values())
    assert (outs["unipc"] - outs["euler"]).abs().max() > 1e-3
    assert (outs["dpmpp_2m"] - outs["euler"]).abs().max() > 1e-3


def test_default_is_the_contracts_scheduler_else_the_familys_reference(wan21, load_tiny, registry):
    handle, pos, neg, latent = wan21
    report = LoraBindSampler().sample(handle, pos, neg, latent, SEED, 2, CFG, 5.0, 0.0, True,
                                      scheduler="default")["ui"]["lorabind_schedule"][0]
    assert report["scheduler"] == "unipc"  # non-distilled Wan: the pipeline's UniPC
    moe = load_tiny("tiny-wan22-t2v")
    (paired,) = WanMoELoRAPair().pair(ModelHandle(moe), F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    distill = LoraBindSampler().sample(paired, encode_text(moe, "a cat"), None, empty_latent(moe, 32, 32, 5), 0, 4,
                                       1.0, 5.0, 0.0, True, scheduler="default")["ui"]["lorabind_schedule"][0]
    assert distill["scheduler"] == "euler"  # the distill LoRAs pin Euler


def test_a_contract_pinning_euler_refuses_unipc_by_name(load_tiny, registry):
    moe = load_tiny("tiny-wan22-t2v")
    (paired,) = WanMoELoRAPair().pair(ModelHandle(moe), F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)["result"]
    with pytest.raises(ContractError, match=rf"{os.path.basename(F.WAN22_HIGH)} is sampled with scheduler euler by "
                                            r"its publisher: scheduler must be euler or default, got unipc"):
        LoraBindSampler().sample(paired, encode_text(moe, "a cat"), None, empty_latent(moe, 32, 32, 5), 0, 4, 1.0,
                                 5.0, 0.0, True, scheduler="unipc")


def test_resolve_scheduler_records_an_override_when_not_enforced():
    from lorabind.loaders.contract_types import ScheduleContract

    pinned = ScheduleContract(source="x.safetensors", kind="distill", family="wan2.1", scheduler="euler")
    assert resolve_scheduler("unipc", [pinned], "unipc", enforce=False) == (
        "unipc", ["scheduler=unipc overrides x.safetensors (sampled with euler by its publisher)"])
    with pytest.raises(ValueError, match="scheduler must be one of"):
        resolve_scheduler("heun", [], "euler", enforce=True)
