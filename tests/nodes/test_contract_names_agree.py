"""Issue 28: the files people run declare a contract, and ``inspect``, the contract endpoint and the sampler
report the same one for each (they all ask ``contracts.discover_contract``). Each name that declares a step
count is enforced in a run; a name without one says which fields it leaves open."""

from __future__ import annotations

import os
import shutil

import pytest

from lorabind.loaders.errors import ContractError
from lorabind.nodes.adapter_nodes import FuseDistillLoRA
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.runtime.commands.inspect import inspect_lora
from lorabind.tiny_models import lora_fixtures as F

SEKO = "Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1.1"
# (loras-relative name as published, the tiny fixture whose keys it carries, the model it fuses into, the step
# count its contract declares or None when the name leaves the steps open)
PUBLISHED = [
    ("lightx2v_T2V_14B_cfg_step_distill_v2_lora_rank64_bf16.safetensors", F.WAN21_DISTILL, "tiny-wan21-t2v", None),
    ("Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32.safetensors", F.WAN21_DISTILL, "tiny-wan21-t2v", None),
    ("Wan21_CausVid_14B_T2V_lora_rank32.safetensors", F.WAN21_DISTILL, "tiny-wan21-t2v", None),
    ("Wan21_CausVid_bidirect2_T2V_1_3B_lora_rank32.safetensors", F.WAN21_DISTILL, "tiny-wan21-t2v", None),
    ("Qwen-Image-2512-Lightning.safetensors", F.QWEN_LIGHTNING, "tiny-qwen-image", None),
    (f"{SEKO}/high_noise_model.safetensors", F.WAN22_HIGH, "tiny-wan22-t2v", 4),
    (f"{SEKO}/low_noise_model.safetensors", F.WAN22_LOW, "tiny-wan22-t2v", 4),
    ("wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors", F.WAN21_DISTILL, "tiny-wan21-t2v", 4),
    ("Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH_fp16.safetensors", F.WAN22_HIGH, "tiny-wan22-t2v", 4),
    ("wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors", F.WAN22_LOW, "tiny-wan22-t2v", 4),
    ("Qwen-Image-Lightning-8steps-V2.0-bf16.safetensors", F.QWEN_LIGHTNING, "tiny-qwen-image", 8),
    ("Qwen-Image-2512-Lightning-4steps-V1.0-fp32.safetensors", F.QWEN_LIGHTNING, "tiny-qwen-image", 4),
]


@pytest.fixture(scope="module")
def published_root(tiny_models_root, tmp_path_factory):
    """A models root with the tiny models and the fixtures saved under the published names."""
    root = tmp_path_factory.mktemp("published")
    os.symlink(tiny_models_root / "diffusers", root / "diffusers")
    for name, fixture, _, _ in PUBLISHED:
        target = root / "loras" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tiny_models_root / "loras" / fixture, target)
    return root


@pytest.fixture(scope="module")
def encoded(tiny_sampler_inputs):
    return tiny_sampler_inputs


def _endpoint_contracts(names: list) -> list:
    from contract_endpoint import ask_contracts

    answers = ask_contracts(names)
    assert all(status == 200 for status, _ in answers), list(zip(names, answers))
    return [body["contract"] for _, body in answers]


# One Wan2.2 expert's distill LoRA fused alone samples that expert's part of the 4-step table only (a stage on
# the other expert would run it without a distill LoRA, which the sampler refuses): steps 0..1 and 2..3.
EXPERT_STAGE = {F.WAN22_HIGH: {"end_step": 2}, F.WAN22_LOW: {"start_step": 2}}


def _run(encoded_inputs, fused, steps, contract, fixture=None):
    _, positive, negative, latent = encoded_inputs
    shift = contract["shift"] if contract["shift"] is not None else 5.0
    cfg = contract["cfg"] if contract["cfg"] is not None else 1.0
    return LoraBindSampler().sample(fused, positive, negative, latent, 0, steps, cfg, shift, 0.0, True,
                                    **EXPERT_STAGE.get(fixture, {}))


@pytest.mark.slow
def test_inspect_endpoint_and_sampler_report_the_same_contract(published_root, registry_at, encoded):
    registry_at(published_root)
    from_endpoint = _endpoint_contracts([name for name, _, _, _ in PUBLISHED])
    for (name, fixture, model_name, steps), answered in zip(PUBLISHED, from_endpoint):
        inspected = inspect_lora(str(published_root / "loras" / name))["contract"]
        handle = encoded[model_name][0]
        fused = FuseDistillLoRA().fuse(handle, name, 1.0)["result"][0]
        report = _run(encoded[model_name], fused, steps or 4, inspected, fixture)["ui"]["lorabind_schedule"][0]
        assert inspected is not None, name
        assert inspected == answered == report["contracts"][0], name
        assert inspected["steps"] == steps, name
        assert ("steps" in inspected["open"]) == (steps is None), name


@pytest.mark.parametrize("name, model_name, steps", [(n, m, s) for n, _, m, s in PUBLISHED if s is not None])
def test_each_name_that_declares_steps_is_enforced_in_a_run(published_root, registry_at, encoded, name, model_name,
                                                           steps):
    registry_at(published_root)
    fused = FuseDistillLoRA().fuse(encoded[model_name][0], name, 1.0)["result"][0]
    contract = inspect_lora(str(published_root / "loras" / name))["contract"]
    with pytest.raises(ContractError, match=rf"{os.path.basename(name)} is a {steps}-step distill LoRA: steps must "
                                            rf"be {steps}, got {steps + 2} "):
        _run(encoded[model_name], fused, steps + 2, contract)
