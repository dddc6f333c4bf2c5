"""Issue 61 item 5: a ``/v1`` request whose shift, guidance, expert boundary or solver breaks a bound file's
contract is refused with a 400 naming the file and the field before it is queued, as ``num_inference_steps`` is
(they were accepted and failed at run time, after the model had loaded). The check reads the prompt's files and
the model folder's ``model_index.json`` only; a request the contract allows passes it untouched."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import lorabind
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.executor.validation import ValidationResult
from lorabind.runtime.server.comfy_api.prompt_service import _refuse_contract_mismatches
from lorabind.runtime.server.openai.jobs import validation_error
from lorabind.runtime.server.openai.requests import parse_chat
from lorabind.runtime.server.openai.templates import fill_in, load_template
from lorabind.usecases.prompt_contracts import early_contract_refusals

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
NODE_CLASSES = runtime_node_classes()[0]
I2V_PAIR = "wan2.2_i2v_A14b_high_noise_lora_rank64_lightx2v_4step_1022.safetensors"
QWEN = "Qwen-Image-Lightning-4steps-V1.0.safetensors"
GUIDE_I2V = {"num_inference_steps": 4, "flow_shift": 12.0, "sample_solver": "euler", "guidance_scale": 1.0,
             "guidance_scale_high": 1.0, "boundary_ratio": 0.875}


def _up_front(template_name: str, **fields):
    """The OpenAI error the request gets before queueing, or None when the prompt passes the check."""
    template = load_template("m", str(WORKFLOWS / f"{template_name}.api.json"), NODE_CLASSES)
    request = parse_chat({"messages": [{"role": "user", "content": "a fox"}], **fields}, {"m": template})
    prompt = fill_in(template, request.values, [])
    result = _refuse_contract_mismatches(SimpleNamespace(node_classes=NODE_CLASSES),
                                         ValidationResult(True, None, ["9"], {}, prompt))
    return None if result.ok else validation_error(template, prompt, result, request.sent)


@pytest.mark.parametrize("change, field, words", [
    ({"guidance_scale_high": 3.5}, "guidance_scale_high", "cfg must be 1, got 3.5"),
    ({"guidance_scale": 3.5}, "guidance_scale", "cfg_low_noise must be 1, got 3.5"),
    ({"flow_shift": 5.0}, "flow_shift", None),  # the I2V pair leaves its shift open: nothing to refuse
    ({"sample_solver": "unipc"}, "sample_solver", "scheduler must be euler or default, got unipc"),
    ({"boundary_ratio": 0.5}, "boundary_ratio", None),  # its open shift pins no sigmas, so no expert split either
])
def test_the_i2v_pairs_contract_is_checked_before_queueing(registry, change, field, words):
    error = _up_front("wan22_i2v_lightx2v_4step", **{**GUIDE_I2V, **change})
    if words is None:
        assert error is None
        return
    assert (error.status, error.param, error.code) == (400, field, "contract_mismatch")
    assert I2V_PAIR in error.message and words in error.message
    assert "wan22_i2v_lightx2v_4step.api.json" in error.message


def test_the_t2v_pairs_expert_split_is_checked_before_queueing(registry):
    """The T2V pair pins shift 5, so its sigmas, so which of its 4 steps run on the high-noise expert."""
    error = _up_front("wan22_lightx2v_4step", boundary_ratio=0.95)
    assert (error.param, error.code) == ("boundary_ratio", "contract_mismatch")
    assert "lightx2v_4step_1217.safetensors is a 4-step distill LoRA: boundary=0.95 runs " in error.message
    assert _up_front("wan22_lightx2v_4step", boundary_ratio=0.875) is None


def test_the_qwen_lightning_shift_and_guidance_are_checked_before_queueing(registry):
    shift = _up_front("qwen_image_lightning", flow_shift=5.0)
    assert (shift.param, shift.code) == ("flow_shift", "contract_mismatch")
    assert f"{QWEN} is a 4-step distill LoRA: shift must be 3, got 5" in shift.message
    cfg = _up_front("qwen_image_lightning", true_cfg_scale=4.0)
    assert cfg.param == "true_cfg_scale" and "cfg must be 1, got 4" in cfg.message


def test_what_the_contracts_allow_passes(registry):
    assert _up_front("wan22_i2v_lightx2v_4step", **GUIDE_I2V) is None
    assert _up_front("qwen_image_lightning", flow_shift=3.0, true_cfg_scale=1.0, sample_solver="euler") is None
    assert _up_front("wan22_tiny_t2v", guidance_scale=7.0, flow_shift=9.0, sample_solver="unipc") is None  # no LoRA


def test_lorabind_run_sees_the_same_refusals(registry):
    template = load_template("m", str(WORKFLOWS / "qwen_image_lightning.api.json"), NODE_CLASSES)
    prompt = fill_in(template, {"flow_shift": 5.0}, [])
    ((node_id, message),) = early_contract_refusals(prompt, NODE_CLASSES, registry)
    assert node_id == "6" and message.startswith(f"{QWEN} is a 4-step distill LoRA: shift must be 3, got 5")
