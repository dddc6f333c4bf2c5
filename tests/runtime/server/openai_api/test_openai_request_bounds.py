"""Issue 61 item 5 on the ``/v1`` endpoints: a 400-digit integer in any float field is a 400 naming the field (it
was a 500, ``OverflowError``), and a flow shift no schedule can be built with (0, 1e-300) is refused by name before
anything is queued (it failed at run time with "division by zero")."""

from __future__ import annotations

from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.server.openai.errors import OpenAIRequestError
from lorabind.runtime.server.openai.requests import parse_chat, parse_video
from lorabind.runtime.server.openai.templates import FIELDS, load_template

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
NODE_CLASSES = runtime_node_classes()[0]
TEMPLATES = ("wan22_lightx2v_4step", "qwen_image_lightning", "minimax_h3_turbo_4step_768p")
HUGE = 10 ** 399  # 400 digits


def _templates() -> dict:
    return {name: load_template("m", str(WORKFLOWS / f"{name}.api.json"), NODE_CLASSES) for name in TEMPLATES}


def _parse(template, **fields):
    if template.is_video:
        return parse_video({"prompt": "a fox", **fields}, {"m": template})
    return parse_chat({"messages": [{"role": "user", "content": "a fox"}], **fields}, {"m": template})


def _refusal(template, **fields) -> OpenAIRequestError:
    with pytest.raises(OpenAIRequestError) as caught:
        _parse(template, **fields)
    assert caught.value.status == 400
    return caught.value


FLOAT_FIELDS = sorted(name for name, kind in FIELDS.items() if kind is float)


def test_every_float_field_is_mapped_by_a_shipped_template():
    mapped = {field for template in _templates().values() for field in template.bindings}
    assert set(FLOAT_FIELDS) <= mapped


@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_a_400_digit_integer_in_a_float_field_is_a_400_naming_the_field(field):
    template = next(t for t in _templates().values() if field in t.bindings)
    error = _refusal(template, **{field: HUGE})
    assert error.param == field
    assert error.message.startswith(f"{field}: expected a number, got 1000000000")
    assert "(400 characters)" in error.message and len(error.message) < 200


@pytest.mark.parametrize("shift", [0, 0.0, 1e-300, -1.0])
def test_a_flow_shift_no_schedule_can_use_is_refused_before_queueing(shift):
    for template in _templates().values():
        error = _refusal(template, flow_shift=shift)
        assert (error.param, error.code) == ("flow_shift", "unsupported_value")
        assert "flow_shift: the flow-matching time shift must be at least 0.001" in error.message


def test_the_audio_shift_keeps_zero_as_the_contracts_own():
    template = _templates()["minimax_h3_turbo_4step_768p"]
    assert _parse(template, audio_flow_shift=0).values["audio_flow_shift"] == 0.0
    error = _refusal(template, audio_flow_shift=1e-300)
    assert error.param == "audio_flow_shift" and "0 (the contract's) or at least 0.001" in error.message


def test_a_shift_at_the_bound_is_taken():
    template = _templates()["wan22_lightx2v_4step"]
    assert _parse(template, flow_shift=0.001).values["flow_shift"] == 0.001
