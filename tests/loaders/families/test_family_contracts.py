"""Distill contracts declared by published Wan / Qwen-Image LoRA names (reference §2.6, §2.9, §5.2)."""

import math

import pytest

from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.families import qwen_image as qwen_package
from lorabind.loaders.families import wan as wan_package
from lorabind.loaders.families.qwen_image import contracts as qwen_image
from lorabind.loaders.families.wan import contracts as wan

# LightX2V / Lightning 4-step timesteps at shift 5: [1000, 937.5, 833.33, 625] -> 0 (reference §2.4, §5.2)
WAN_4STEP_SIGMAS = (1.0, 0.9375, 0.833333, 0.625, 0.0)
WAN_8STEP_SIGMAS = (1.0, 0.972222, 0.9375, 0.892857, 0.833333, 0.75, 0.625, 0.416667, 0.0)


@pytest.mark.parametrize("name, family", [
    ("wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors", "wan2.2_moe"),
    ("wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors", "wan2.2_moe"),
    ("wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors", "wan2.2_moe"),
    ("Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH_fp16.safetensors", "wan2.2_moe"),
    ("Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1/high_noise_model.safetensors", "wan2.2_moe"),
    ("wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors", "wan2.1"),
    ("wan2.1_i2v_lora_rank64_lightx2v_4step.safetensors", "wan2.1"),
])
def test_wan_4step_distill_names(name, family):
    contract = wan.declared_contract(name, {}, 64)
    assert (contract.kind, contract.family, contract.steps, contract.shift, contract.cfg, contract.rank) == (
        "distill", family, 4, 5.0, 1.0, 64)
    assert contract.source == name.rsplit("/", 1)[-1]
    assert contract.sigmas == pytest.approx(WAN_4STEP_SIGMAS, abs=1e-6)


@pytest.mark.parametrize("name", [
    "wan2.2_i2v_A14b_high_noise_lora_rank64_lightx2v_4step_1022.safetensors",
    "Wan_2_2_I2V_A14B_LOW_lightx2v_4step_lora_260412_rank_64_fp16.safetensors",
])
def test_wan22_i2v_lightx2v_names_pin_steps_and_cfg_but_not_the_shift(name):
    """LightX2V (shift 5) and vllm-omni (flow shift 12) publish different schedules for the i2v pair."""
    contract = wan.declared_contract(name, {}, 64)
    assert (contract.family, contract.steps, contract.cfg, contract.shift, contract.sigmas) == (
        "wan2.2_moe", 4, 1.0, None, None)
    assert contract.tasks == ("i2v",)


def test_wan_8step_name_uses_the_8_step_shift_5_grid():
    contract = wan.declared_contract("Wan2.2-T2V-A14B-8steps-lightx2v_high_noise.safetensors", {}, None)
    assert contract.steps == 8 and contract.sigmas == pytest.approx(WAN_8STEP_SIGMAS, abs=1e-6)


@pytest.mark.parametrize("name", [
    "my_wan_style_lora.safetensors",
    "lightx2v/my_wan_style_lora.safetensors",  # a folder the user named: only the release layout's folder counts
    "my_loras/high_noise_model.safetensors",  # the release layout's file name, but no step count in the folder
    "Qwen-Image-Lightning-4steps-V1.0.safetensors",
    "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors",
])
def test_names_without_a_wan_distill_contract(name):
    assert wan.declared_contract(name, {}, 64) is None


@pytest.mark.parametrize("name, steps", [
    ("Qwen-Image-Lightning-4steps-V1.0.safetensors", 4),
    ("Qwen-Image-Lightning-8steps-V2.0-bf16.safetensors", 8),
    ("Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors", 4),
    ("Qwen-Image-2512-Lightning-8steps-V1.0-fp32.safetensors", 8),
])
def test_qwen_lightning_names(name, steps):
    contract = qwen_image.declared_contract(name, {}, None)
    assert (contract.kind, contract.family, contract.steps, contract.shift, contract.cfg) == (
        "distill", "qwen_image", steps, 3.0, 1.0)
    assert contract.sigmas == shifted_sigmas(steps, 3.0)


def test_qwen_lightning_schedule_equals_its_reference_scheduler():
    """Lightning's published scheduler config (exponential dynamic shift, base_shift = max_shift = log 3) fed the
    grid QwenImagePipeline builds gives exactly the declared sigmas."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler.from_config({
        "base_image_seq_len": 256, "base_shift": math.log(3), "max_image_seq_len": 8192, "max_shift": math.log(3),
        "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": None, "time_shift_type": "exponential",
        "use_dynamic_shifting": True})
    for steps in (4, 8):
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=math.log(3))
        declared = qwen_image.declared_contract(f"Qwen-Image-Lightning-{steps}steps-V1.0.safetensors", {}, None)
        assert declared.sigmas == pytest.approx(scheduler.sigmas.tolist(), abs=1e-6)


def test_qwen_names_without_a_contract_and_no_checkpoint_contracts():
    assert qwen_image.declared_contract("qwen_style_lora.safetensors", {}, 16) is None
    assert qwen_package.FAMILY.contracts.checkpoint_contract({"_class_name": "QwenImagePipeline"}, "qwen") is None
    assert wan_package.FAMILY.contracts.checkpoint_contract({"_class_name": "WanPipeline", "boundary_ratio": 0.875}, "wan") is None


@pytest.mark.parametrize("name, family, tasks, pinned, open_fields", [
    ("lightx2v_T2V_14B_cfg_step_distill_v2_lora_rank64_bf16.safetensors", "wan2.1", None, {"cfg": 1.0},
     ("steps", "shift")),
    ("Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32.safetensors", "wan2.1", None, {"cfg": 1.0},
     ("steps", "shift")),
    ("lightx2v_I2V_14B_480p_cfg_step_distill_rank128_bf16.safetensors", "wan2.1", ("i2v",), {"cfg": 1.0},
     ("steps", "shift")),
    ("lightx2v_I2V_14B_720p_cfg_step_distill_rank64_bf16.safetensors", "wan2.1", ("i2v",), {"cfg": 1.0},
     ("steps", "shift")),
    ("Wan21_CausVid_14B_T2V_lora_rank32.safetensors", "wan2.1", None, {}, ("steps", "shift", "cfg")),
    ("Wan21_CausVid_bidirect2_T2V_1_3B_lora_rank32.safetensors", "wan2.1", None, {}, ("steps", "shift", "cfg")),
])
def test_distill_names_without_a_step_count_say_which_fields_they_leave_open(name, family, tasks, pinned,
                                                                            open_fields):
    contract = wan.declared_contract(name, {}, 64)
    assert (contract.kind, contract.family, contract.tasks, contract.open_fields) == (
        "distill", family, tasks, open_fields)
    assert (contract.steps, contract.sigmas) == (None, None)
    assert {field: getattr(contract, field) for field in ("shift", "cfg") if getattr(contract, field) is not None} \
        == pinned
    assert contract.describe().startswith(f"{name}: distill") and " open" in contract.describe()


def test_release_layout_reads_the_step_count_from_its_folder():
    for folder in ("Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1.1", "Wan2.2-T2V-A14B-4steps-lora-250928"):
        for expert in ("high_noise_model", "low_noise_model"):
            contract = wan.declared_contract(f"{folder}/{expert}.safetensors", {}, 64)
            assert (contract.steps, contract.family, contract.source) == (4, "wan2.2_moe", f"{expert}.safetensors")


def test_qwen_lightning_without_a_step_count_pins_shift_and_cfg_and_leaves_steps_open():
    contract = qwen_image.declared_contract("loras/Qwen-Image-2512-Lightning.safetensors", {}, 16)
    assert (contract.kind, contract.steps, contract.sigmas, contract.shift, contract.cfg, contract.open_fields) == (
        "distill", None, None, 3.0, 1.0, ("steps",))
    assert contract.source == "Qwen-Image-2512-Lightning.safetensors"
