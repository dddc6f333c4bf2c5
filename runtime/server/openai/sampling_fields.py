"""The guides' per-request sampling fields whose meaning is more than "set this input": ``sample_solver`` and
``guidance_scale_high``.

Why a step of its own: the other sampling fields (``flow_shift``, ``boundary_ratio``, ``audio_flow_shift``,
``task``) each set one input a template names, and the sampler checks them against the bound contracts like any
``/prompt`` value. These two need reading first:

- ``sample_solver`` names a step rule, which our sampler calls a scheduler. Only the names of schedulers we run
  are taken; any other (``ddim``, ``dpm++``, ``default``) is refused by name here, with ours listed, rather than
  reaching a node as an unknown choice.
- ``guidance_scale_high`` is the high-noise expert's guidance in vllm-omni's reading, where ``guidance_scale`` then
  guides the low-noise expert. Given together, ``guidance_scale`` becomes ``guidance_scale_2`` (the low-noise
  field, diffusers' name), so each reaches the input its template maps it to. Alone, it guides both experts, as
  ``guidance_scale`` does.
"""

from __future__ import annotations

from ....loaders.contract_types import MIN_SHIFT
from ....loaders.generation.schedulers import SCHEDULERS
from .errors import OpenAIRequestError
from .templates import Template

# the shift fields, and whether 0 is a value of theirs ("the contract's", MiniMax-H3's audio shift); any other value
# below MIN_SHIFT builds no schedule (the sampler's shift input takes 0 to 100)
SHIFT_FIELDS = {"flow_shift": False, "audio_flow_shift": True}
SOLVER_FIELD = "sample_solver"
HIGH_NOISE_GUIDANCE = "guidance_scale_high"
GUIDANCE = "guidance_scale"
LOW_NOISE_GUIDANCE = "guidance_scale_2"


def read_sampling_fields(template: Template, generation: dict) -> dict:
    """Check ``sample_solver``'s name and give ``guidance_scale`` its low-noise meaning next to
    ``guidance_scale_high`` (in place); 400 naming the field otherwise. Returns {field now set: the name the
    request gave it} for each field renamed, so errors name what the client sent."""
    solver = generation.get(SOLVER_FIELD)
    if solver is not None and solver not in SCHEDULERS:
        raise OpenAIRequestError(f"{SOLVER_FIELD}: {solver!r} is not a solver lorabind runs; use one of "
                                 f"{', '.join(SCHEDULERS)}", param=SOLVER_FIELD, code="unsupported_value")
    if HIGH_NOISE_GUIDANCE not in generation or GUIDANCE not in generation:
        return {}
    if LOW_NOISE_GUIDANCE in generation:
        raise OpenAIRequestError(f"{GUIDANCE}: with {HIGH_NOISE_GUIDANCE} it is the low-noise expert's guidance, "
                                 f"which {LOW_NOISE_GUIDANCE} sets too; give one of them", param=GUIDANCE)
    if LOW_NOISE_GUIDANCE not in template.bindings:
        raise OpenAIRequestError(f"{GUIDANCE}: with {HIGH_NOISE_GUIDANCE} it is the low-noise expert's guidance, "
                                 f"but model {template.name!r} has no input for it ({template.file_name} maps no "
                                 f"{LOW_NOISE_GUIDANCE}); send {GUIDANCE} alone", param=GUIDANCE)
    generation[LOW_NOISE_GUIDANCE] = generation.pop(GUIDANCE)
    return {LOW_NOISE_GUIDANCE: GUIDANCE}


def check_shifts(values: dict, sent: dict) -> None:
    """Refuse (400 naming the field as sent) a shift no schedule can be built with, before the prompt is queued:
    the sampler would refuse it only after the model has loaded."""
    for field, zero_allowed in SHIFT_FIELDS.items():
        value = values.get(field)
        if value is None or (zero_allowed and value == 0) or value >= MIN_SHIFT:
            continue
        name = sent.get(field, field)
        allowed = f"0 (the contract's) or at least {MIN_SHIFT:g}" if zero_allowed else f"at least {MIN_SHIFT:g}"
        raise OpenAIRequestError(f"{name}: the flow-matching time shift must be {allowed}, got {value:g}",
                                 param=name, code="unsupported_value")
