"""Issue 57: the cfg contract holds for every ComfyUI guider, in real ComfyUI 0.3.64 and 0.30.0.

One Wan2.2 expert (the tiny file ``build-tiny --comfyui`` writes) with the 4-step lightx2v LoRA through
``LoraBindLoRA``, sampled by core ComfyUI with each guider. Before, the check read ``guider.cfg`` once before
sampling: ``DualCFGGuider`` (its ``cfg`` stays 1, it samples with its own two scales) and ``CFGOverride`` (0.30.0:
it sets cfg at each step, after that check) ran a cfg-1 distill LoRA at cfg 3.5 with "contract enforced". Now
each is refused before the first step (no step-progress message), naming the file and ``cfg``; the same guiders
at cfg 1 run and give KSamplerAdvanced's latent at cfg 1 (exactly; DualCFGGuider's nested style within float32
rounding, as it batches three conditionings). A guidance hook (CFGNorm), a perpendicular
negative (PerpNegGuider's ``neg_scale``) and another sampler than the contract's euler are refused by name; a
single LoraBindLoRA given the other expert's file is refused when the MODEL says which expert it is.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from real_comfyui import build_tiny_for_comfyui, run_native_prompts, version_tuple

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY_WORKFLOW = REPO / "tests" / "data" / "comfy_wan22_lightx2v_4step.tiny.api.json"
HIGH_LORA = "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"
LOW_LORA = HIGH_LORA.replace("high_noise", "low_noise")
SEED = 7
MODEL = ["21", 0]  # the high expert, LoRA applied, shift 5
POSITIVE, NEGATIVE = ["5", 0], ["6", 0]


def _base() -> dict:
    """Loaders, conditioning, latent, and the high expert with the LoRA through LoraBindLoRA and shift 5."""
    tiny = json.loads(TINY_WORKFLOW.read_text())
    prompt = {node_id: tiny[node_id] for node_id in ("1", "5", "6", "10")}
    lora = tiny["7"]["inputs"]["lora_high"]
    prompt["20"] = {"class_type": "LoraBindLoRA", "inputs": {"model": ["1", 0], "lora_name": lora, "strength": 1.0,
                                                             "lenient": False, "enforce_contract": True}}
    prompt["21"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["20", 0], "shift": 5.0}}
    return prompt


def _with(prompt: dict, nodes: dict) -> dict:
    prompt.update({node_id: {"class_type": kind, "inputs": inputs} for node_id, (kind, inputs) in nodes.items()})
    return prompt


def _ksampler(label: str, cfg: float, model=MODEL, sampler: str = "euler") -> dict:
    return _with(_base(), {
        "30": ("KSamplerAdvanced", {"model": model, "add_noise": "enable", "noise_seed": SEED, "steps": 4, "cfg": cfg,
                                    "sampler_name": sampler, "scheduler": "simple", "positive": POSITIVE,
                                    "negative": NEGATIVE, "latent_image": ["10", 0], "start_at_step": 0,
                                    "end_at_step": 10000, "return_with_leftover_noise": "disable"}),
        "31": ("SaveLatent", {"samples": ["30", 0], "filename_prefix": f"latents/{label}"}),
    })


def _custom(label: str, guider: tuple) -> dict:
    """SamplerCustomAdvanced with ``guider`` (node id 40) on KSamplerAdvanced's noise, sampler and sigmas."""
    return _with(_base(), {
        "40": guider,
        "41": ("RandomNoise", {"noise_seed": SEED}),
        "42": ("KSamplerSelect", {"sampler_name": "euler"}),
        "43": ("BasicScheduler", {"model": MODEL, "scheduler": "simple", "steps": 4, "denoise": 1.0}),
        "44": ("SamplerCustomAdvanced", {"noise": ["41", 0], "guider": ["40", 0], "sampler": ["42", 0],
                                         "sigmas": ["43", 0], "latent_image": ["10", 0]}),
        "45": ("SaveLatent", {"samples": ["44", 0], "filename_prefix": f"latents/{label}"}),
    })


def _dual(cfg_conds: float, cfg_cond2_negative: float, style: str = "regular") -> tuple:
    return ("DualCFGGuider", {"model": MODEL, "cond1": POSITIVE, "cond2": NEGATIVE, "negative": NEGATIVE,
                              "cfg_conds": cfg_conds, "cfg_cond2_negative": cfg_cond2_negative, "style": style})


def _perp_neg(cfg: float, neg_scale: float) -> tuple:
    return ("PerpNegGuider", {"model": MODEL, "positive": POSITIVE, "negative": NEGATIVE,
                              "empty_conditioning": NEGATIVE, "cfg": cfg, "neg_scale": neg_scale})


def _override(label: str, override_cfg: float, sampler_cfg: float, start: float = 0.0) -> dict:
    prompt = _ksampler(label, sampler_cfg, model=["50", 0])
    return _with(prompt, {"50": ("CFGOverride", {"model": MODEL, "cfg": override_cfg, "start_percent": start,
                                                 "end_percent": 1.0})})


def _cfg_norm(label: str) -> dict:
    return _with(_ksampler(label, 1.0, model=["50", 0]), {"50": ("CFGNorm", {"model": MODEL, "strength": 0.5})})


def _other_expert_after_the_pair() -> dict:
    """The pair's high-noise output, then a LoraBindLoRA with the low-noise file: the MODEL says which it is."""
    tiny = json.loads(TINY_WORKFLOW.read_text())
    prompt = _ksampler("other_expert_after_the_pair", 1.0, model=["61", 0])
    prompt.update({node_id: tiny[node_id] for node_id in ("2", "7")})
    return _with(prompt, {"60": ("LoraBindLoRA", {"model": ["7", 0], "lora_name": tiny["7"]["inputs"]["lora_low"],
                                                  "strength": 1.0, "lenient": False, "enforce_contract": True}),
                          "61": ("ModelSamplingSD3", {"model": ["60", 0], "shift": 5.0})})


def _other_expert_on_its_file() -> dict:
    """UNETLoader's high-noise file, then a LoraBindLoRA with the low-noise file (0.30.0 keeps the file name)."""
    prompt = _ksampler("other_expert_file", 1.0)
    prompt["20"]["inputs"]["lora_name"] = prompt["20"]["inputs"]["lora_name"].replace("high_noise", "low_noise")
    return prompt


def _prompts(version: str) -> dict:
    prompts = {
        "ksampler_cfg1": _ksampler("ksampler_cfg1", 1.0),
        "dual_3_5": _custom("dual_3_5", _dual(3.5, 3.5)),
        "dual_1": _custom("dual_1", _dual(1.0, 1.0)),
        "dual_1_nested": _custom("dual_1_nested", _dual(1.0, 1.0, "nested")),
        "basic": _custom("basic", ("BasicGuider", {"model": MODEL, "conditioning": POSITIVE})),
        "perp_neg_0": _custom("perp_neg_0", _perp_neg(1.0, 0.0)),
        "perp_neg_1": _custom("perp_neg_1", _perp_neg(1.0, 1.0)),
        "dpmpp_2m": _ksampler("dpmpp_2m", 1.0, sampler="dpmpp_2m"),
        "cfg_norm": _cfg_norm("cfg_norm"),
        "pair_then_other_expert": _other_expert_after_the_pair(),
    }
    if version_tuple(version) >= version_tuple("0.30.0"):  # CFGOverride is 0.30.0's; 0.3.64 keeps no file name
        prompts.update({
            "override_3_5": _override("override_3_5", 3.5, 1.0),
            "override_3_5_late": _override("override_3_5_late", 3.5, 1.0, start=0.5),
            "override_1": _override("override_1", 1.0, 3.5),
            "other_expert_file": _other_expert_on_its_file(),
        })
    return prompts


@pytest.fixture(scope="module")
def native_models(tmp_path_factory) -> Path:
    return build_tiny_for_comfyui(tmp_path_factory.mktemp("guider_models"))


@pytest.fixture(scope="module")
def guider_runs(tmp_path_factory, native_models, comfy_version):
    work = tmp_path_factory.mktemp("guiders")
    results, output, log = run_native_prompts(comfy_version, work, native_models, _prompts(comfy_version),
                                              "LoraBindLoRA,LoraBindLoRAPair,DualCFGGuider,PerpNegGuider")
    return results, output, log, comfy_version


def _latent(guider_runs, label: str):
    run = guider_runs[0][label]
    assert run["status"] == "success", run["error"]
    (saved,) = [latent for output in run["outputs"].values() for latent in output.get("latents", ())]
    return load_file(str(guider_runs[1] / saved["subfolder"] / saved["filename"]))["latent_tensor"]


def _refused(guider_runs, label: str, node_id: str) -> str:
    run = guider_runs[0][label]
    assert run["status"] == "error", f"{label} ran"
    assert run["error"]["node_id"] == node_id and run["error"]["exception_type"] == "ContractError", run["error"]
    assert run["progress_events"] == 0  # refused before the first step
    message = run["error"]["exception_message"]
    assert HIGH_LORA in message and ("cfg must be 1" in message or "sampler:" in message), message
    return message


def _needs_0_30(guider_runs):
    if version_tuple(guider_runs[3]) < version_tuple("0.30.0"):
        pytest.skip(f"ComfyUI {guider_runs[3]} has no CFGOverride node (0.30.0 has)")


def test_dual_cfg_guider_at_3_5_is_refused_before_the_first_step_naming_the_file_and_cfg(guider_runs):
    message = _refused(guider_runs, "dual_3_5", "44")
    assert "cfg_conds 3.5, cfg_cond2_negative 3.5, style regular (DualCFGGuider)" in message


def test_cfg_override_at_3_5_is_refused_before_the_first_step_even_where_it_starts_later(guider_runs):
    _needs_0_30(guider_runs)
    assert "the sampler uses cfg 3.5 at the step from sigma 1.0000" in _refused(guider_runs, "override_3_5", "30")
    # from 50 %: its first step is further down the table, and it is still refused before any step runs
    assert "the sampler uses cfg 3.5 at the step from sigma" in _refused(guider_runs, "override_3_5_late", "30")


@pytest.mark.parametrize("label", ["dual_1", "dual_1_nested", "basic", "perp_neg_0", "override_1"])
def test_the_same_guiders_at_cfg_1_run_and_equal_ksampler_advanced_at_cfg_1(guider_runs, label):
    if label == "override_1":  # KSamplerAdvanced at cfg 3.5, CFGOverride sets 1 over every step
        _needs_0_30(guider_runs)
    reference, latent = _latent(guider_runs, "ksampler_cfg1"), _latent(guider_runs, label)
    assert latent.shape == reference.shape and latent.abs().sum() > 0
    if label == "dual_1_nested":
        # the nested style evaluates its three conditionings in one batch (no cfg-1 shortcut): the same values up
        # to float32 rounding of a batch of 3 (measured: 7e-4 on latents of magnitude ~1e3)
        torch.testing.assert_close(latent, reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))
        return
    assert latent.equal(reference), float((latent - reference).abs().max())


def test_a_guidance_hook_and_a_perpendicular_negative_are_refused_by_name(guider_runs):
    assert "cfg 1, neg_scale 1 (PerpNegGuider)" in _refused(guider_runs, "perp_neg_1", "44")
    assert "CFGNorm's sampler_post_cfg_function (cfg_norm)" in _refused(guider_runs, "cfg_norm", "30")


def test_a_sampler_other_than_euler_is_refused_naming_it(guider_runs):
    message = _refused(guider_runs, "dpmpp_2m", "30")
    assert "sampler: it is sampled with euler by its publisher, the sampler runs dpmpp_2m" in message


def test_a_single_lora_node_refuses_the_other_experts_file_when_the_model_says_which_expert(guider_runs):
    runs = guider_runs[0]
    after_pair = runs["pair_then_other_expert"]
    assert after_pair["status"] == "error" and after_pair["error"]["node_id"] == "60"
    assert (f"{LOW_LORA} says low noise but goes into the high-noise expert MODEL (LoraBindLoRA lora_name)"
            in after_pair["error"]["exception_message"])
    assert "an earlier LoraBindLoRAPair made it the high-noise expert" in after_pair["error"]["exception_message"]
    if version_tuple(guider_runs[3]) >= version_tuple("0.30.0"):  # 0.3.64 keeps no file name on the MODEL
        on_file = runs["other_expert_file"]
        assert on_file["status"] == "error" and on_file["error"]["node_id"] == "20"
        assert "its file wan2.2_t2v_high_noise_comfyui_tiny_bf16.safetensors says so" in \
            on_file["error"]["exception_message"]
