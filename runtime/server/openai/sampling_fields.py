"""The guides' per-request sampling fields whose meaning is more than "set this input": ``sample_solver`` and
the guidance fields.

Why a step of its own: the other sampling fields (``flow_shift``, ``boundary_ratio``, ``audio_flow_shift``,
``task``) each set one input a template names, and the sampler checks them against the bound contracts like any
``/prompt`` value. These need reading first:

- ``sample_solver`` names a step rule, which our sampler calls a scheduler. Only the names of schedulers we run
  are taken; any other (``ddim``, ``dpm++``, ``default``) is refused by name here, with ours listed, rather than
  reaching a node as an unknown choice.
- ``guidance_scale_2`` is the high-noise expert's guidance, as in vllm-omni (``guidance_scale_2 =
  args.guidance_scale_high`` in its examples; its Wan2.2 pipelines guide the high-noise expert with it and the
  low-noise one with ``guidance_scale``), and ``guidance_scale_high``, the guides' flag name, is the same field. A
  template with two experts maps ``guidance_scale`` to the low-noise input and the high-noise fields to the
  high-noise one; ``guidance_scale`` alone guides both (vllm-omni: the high-noise guidance defaults to it), and a
  high-noise field alone leaves the low-noise expert at the template's guidance.
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
GUIDANCE_2 = "guidance_scale_2"  # vllm-omni's high-noise guidance (diffusers' guidance_scale_2 is the low-noise one)
HIGH_NOISE_FIELDS = (GUIDANCE_2, HIGH_NOISE_GUIDANCE)


def read_sampling_fields(template: Template, generation: dict) -> dict:
    """Check ``sample_solver``'s name and give the guidance fields their expert (in place); 400 naming the field
    otherwise. Returns {field now set: the name the request gave it} for each field set on the request's behalf,
    so errors name what the client sent."""
    solver = generation.get(SOLVER_FIELD)
    if solver is not None and solver not in SCHEDULERS:
        raise OpenAIRequestError(f"{SOLVER_FIELD}: {solver!r} is not a solver lorabind runs; use one of "
                                 f"{', '.join(SCHEDULERS)}", param=SOLVER_FIELD, code="unsupported_value")
    given = [name for name in HIGH_NOISE_FIELDS if name in generation]
    if len(given) == len(HIGH_NOISE_FIELDS):
        raise OpenAIRequestError(f"{HIGH_NOISE_GUIDANCE}: the high-noise expert's guidance, which {GUIDANCE_2} "
                                 f"sets too (vllm-omni: {GUIDANCE_2} = guidance_scale_high); give one of them",
                                 param=HIGH_NOISE_GUIDANCE)
    mapped = [name for name in HIGH_NOISE_FIELDS if name in template.bindings]
    if not mapped:  # one expert: check_values has refused the high-noise fields already
        return {}
    if GUIDANCE in generation and not given:  # alone it guides both experts
        generation[mapped[0]] = generation[GUIDANCE]
        return {mapped[0]: GUIDANCE}
    if given and GUIDANCE not in generation and not template.default_of(GUIDANCE):
        # the template's low-noise input at 0 follows the high-noise guidance: keep it at the template's own instead
        generation[GUIDANCE] = template.default_of(given[0])
    return {}


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
