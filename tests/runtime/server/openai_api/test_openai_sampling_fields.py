"""The guides' per-request sampling fields on the OpenAI-style endpoints (issue 44 item 3): ``flow_shift``,
``boundary_ratio``, ``sample_solver``, ``guidance_scale_high``, and MiniMax-H3's ``task`` and ``audio_flow_shift``,
mapped onto the shipped templates' inputs and refused by name where a template or our samplers have no use for
them. The served run of the guide's I2V request is in ``test_server_openai_guide_i2v.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import lorabind
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.server.openai.errors import OpenAIRequestError
from lorabind.runtime.server.openai.jobs import validation_error
from lorabind.runtime.server.openai.requests import parse_chat, parse_video
from lorabind.runtime.server.openai.results import failure
from lorabind.runtime.server.openai.templates import fill_in, load_template

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
NODE_CLASSES = runtime_node_classes()[0]
I2V_PAIR = "wan2.2_i2v_A14b_high_noise_lora_rank64_lightx2v_4step_1022.safetensors"
# the guide's I2V recipe: --flow-shift 12 --sample-solver euler --guidance-scale 1.0 --guidance-scale-high 1.0
# --boundary-ratio 0.875 (4 steps)
GUIDE_I2V = {"num_inference_steps": 4, "flow_shift": 12.0, "sample_solver": "euler", "guidance_scale": 1.0,
             "guidance_scale_high": 1.0, "boundary_ratio": 0.875}
SAMPLING_FIELDS = ("flow_shift", "boundary_ratio", "sample_solver", "guidance_scale_high")


def _template(name: str):
    return load_template("m", str(WORKFLOWS / f"{name}.api.json"), NODE_CLASSES)


def _chat(template, **fields):
    return parse_chat({"messages": [{"role": "user", "content": "a fox"}], **fields}, {"m": template})


@pytest.mark.parametrize("name", ["wan22_lightx2v_4step", "wan22_i2v_lightx2v_4step", "wan22_tiny_t2v",
                                  "wan22_strength_schedule", "wan22_gguf_lightx2v"])
def test_the_shipped_wan22_templates_take_the_guides_sampling_fields(name):
    assert set(SAMPLING_FIELDS) <= set(_template(name).bindings)


def test_the_guides_i2v_request_sets_the_sampler_inputs():
    template = _template("wan22_i2v_lightx2v_4step")
    request = _chat(template, **GUIDE_I2V, seed=7)
    sampler = fill_in(template, request.values, [])["7"]["inputs"]
    assert {k: sampler[k] for k in ("steps", "shift", "scheduler", "cfg", "cfg_low_noise", "boundary", "seed")} == {
        "steps": 4, "shift": 12.0, "scheduler": "euler", "cfg": 1.0, "cfg_low_noise": 1.0, "boundary": 0.875,
        "seed": 7}


def _experts_guidance(template, **fields) -> tuple:
    """(high-noise expert's guidance, low-noise expert's) the filled-in sampler runs: cfg, and cfg_low_noise
    unless it is 0 (then the low-noise expert follows cfg)."""
    inputs = fill_in(template, _chat(template, **fields).values, [])["6"]["inputs"]
    return inputs["cfg"], inputs["cfg_low_noise"] or inputs["cfg"]


@pytest.mark.parametrize("high", ["guidance_scale_high", "guidance_scale_2"])
def test_the_high_noise_fields_guide_the_high_noise_expert_and_guidance_scale_the_low_noise_one(high):
    """vllm-omni: ``guidance_scale_2 = args.guidance_scale_high``, the high-noise expert's guidance."""
    template = _template("wan22_lightx2v_4step")
    assert _experts_guidance(template, guidance_scale=3.0, **{high: 4.0}) == (4.0, 3.0)
    assert _experts_guidance(template, **{high: 4.0}) == (4.0, 1.0)  # the low-noise expert keeps the template's
    assert _experts_guidance(template, guidance_scale=3.0) == (3.0, 3.0)  # alone: both experts


def test_both_spellings_of_the_high_noise_guidance_are_refused_together():
    error = _refusal(_chat, _template("wan22_lightx2v_4step"), guidance_scale_high=4.0, guidance_scale_2=2.0)
    assert error.param == "guidance_scale_high" and "guidance_scale_2" in error.message


def _refusal(call, *args, **kwargs) -> OpenAIRequestError:
    with pytest.raises(OpenAIRequestError) as caught:
        call(*args, **kwargs)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("solver", ["euler", "unipc", "dpmpp_2m"])
def test_sample_solver_names_our_schedulers(solver):
    template = _template("wan22_lightx2v_4step")
    assert fill_in(template, _chat(template, sample_solver=solver).values, [])["6"]["inputs"]["scheduler"] == solver


@pytest.mark.parametrize("solver", ["ddim", "dpm++", "default", "UniPC"])
def test_any_other_sample_solver_is_refused_by_name(solver):
    error = _refusal(_chat, _template("wan22_lightx2v_4step"), sample_solver=solver)
    assert error.param == "sample_solver" and repr(solver) in error.message
    assert "euler, unipc, dpmpp_2m" in error.message


def test_a_template_without_experts_refuses_the_expert_fields_by_name():
    template = _template("qwen_image_lightning")
    assert _chat(template, flow_shift=3.0, sample_solver="euler").values["flow_shift"] == 3.0
    for name in ("boundary_ratio", "guidance_scale_high", "audio_flow_shift", "task"):
        error = _refusal(_chat, template, **{name: 1.0 if name != "task" else "t2va"})
        assert error.param == name and "qwen_image_lightning.api.json" in error.message


def test_the_minimax_template_takes_the_task_and_both_shifts():
    template = _template("minimax_h3_turbo_4step_768p")
    assert template.is_video
    request = parse_video({"prompt": "a cat", "task": "fl2va", "flow_shift": "6", "audio_flow_shift": "3",
                           "num_inference_steps": "4"}, {"m": template})
    prompt = fill_in(template, request.values, [])
    assert prompt["2"]["inputs"]["task"] == "fl2va"
    assert {k: prompt["6"]["inputs"][k] for k in ("shift", "audio_flow_shift", "steps")} == {
        "shift": 6.0, "audio_flow_shift": 3.0, "steps": 4}
    assert _refusal(parse_video, {"prompt": "a cat", "boundary_ratio": 0.9}, {"m": template}).param == \
        "boundary_ratio"


@pytest.mark.parametrize("message, field", [
    (f"{I2V_PAIR} is a 4-step distill LoRA: cfg must be 1, got 3.5 (its file name declares this contract; set "
     "enforce_contract off to override it explicitly)", "guidance_scale_high"),
    # next to guidance_scale_high, guidance_scale sets the low-noise expert's guidance: named as it was sent
    (f"{I2V_PAIR} is a 4-step distill LoRA: cfg_low_noise must be 1, got 3.5 (…)", "guidance_scale"),
    (f"{I2V_PAIR} is sampled with scheduler euler by its publisher: scheduler must be euler or default, got unipc "
     "(set enforce_contract off to override it explicitly)", "sample_solver"),
    (f"{I2V_PAIR} is a 4-step distill LoRA: boundary=0.5 runs 1 of 4 steps on the high-noise expert, but the "
     "model's boundary_ratio 0.875 runs 3", "boundary_ratio"),
])
def test_a_contract_refusal_names_the_field_the_request_sent(message, field):
    """``guidance_scale`` and ``guidance_scale_high`` both set the sampler's cfg: the 400 names the one sent."""
    template = _template("wan22_i2v_lightx2v_4step")
    sent = _chat(template, **{**GUIDE_I2V, "guidance_scale": 3.5, "guidance_scale_high": 3.5}).sent
    entry = {"status": {"status_str": "error", "messages": [["execution_error", {
        "node_id": "7", "node_type": "LoraBindSampler", "exception_message": message,
        "exception_type": "lorabind.loaders.errors.ContractError"}]]}}
    error = failure(template, entry, sent)
    assert (error.status, error.param, error.code) == (400, field, "contract_mismatch")
    assert I2V_PAIR in error.message and "wan22_i2v_lightx2v_4step.api.json" in error.message
    if field == "guidance_scale_high":  # guidance_scale alone sets cfg too, and is then the field named
        sent = {key: value for key, value in GUIDE_I2V.items() if key != "guidance_scale_high"}
        alone = _chat(template, **{**sent, "guidance_scale": 3.5})
        assert failure(template, entry, alone.sent).param == "guidance_scale"


def test_a_validation_refusal_of_the_minimax_task_names_the_task_field():
    template = _template("minimax_h3_turbo_4step_768p")
    errors = [{"type": "value_not_in_list", "message": "Value not in list", "details": "task: 'ti2v' not in [...]",
               "extra_info": {"input_name": "task"}}]
    result = SimpleNamespace(node_errors={"2": {"errors": errors, "class_type": "MiniMaxTurboSchedule"}}, error={})
    error = validation_error(template, template.prompt, result, {"task": "task"})
    assert error.param == "task" and "minimax_h3_turbo_4step_768p.api.json" in error.message


@pytest.mark.parametrize("message, field, node", [
    ("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors requires flow_shift=6, got flow_shift=12",
     "flow_shift", "6"),
    ("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors requires audio_flow_shift=3, got audio_flow_shift=5",
     "audio_flow_shift", "6"),
    # the task is the Turbo schedule node's input; the sampler refuses it
    ("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors is a fl2v Turbo artifact and serves tasks ['t2va', "
     "'fl2va'], got task='ref2va'", "task", "2"),
])
def test_a_minimax_refusal_names_the_field_in_its_own_words(message, field, node):
    template = _template("minimax_h3_turbo_4step_768p")
    sent = parse_video({"prompt": "a cat", "task": "ref2va", "flow_shift": 12, "audio_flow_shift": 5},
                       {"m": template}).sent
    entry = {"status": {"status_str": "error", "messages": [["execution_error", {
        "node_id": "6", "node_type": "LoraBindSampler", "exception_message": message,
        "exception_type": "lorabind.loaders.errors.ContractError"}]]}}
    error = failure(template, entry, sent)
    assert (error.status, error.param, error.code) == (400, field, "contract_mismatch")
    assert f"of node {node} in minimax_h3_turbo_4step_768p.api.json" in error.message
