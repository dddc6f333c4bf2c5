"""Wan2.1 / Wan2.2 sampling contracts: distill LoRAs (LightX2V, Lightning, Seko) declare N steps in their name."""

from __future__ import annotations

import re
from typing import Optional

from ...contract_types import ResolvedSchedule, SamplingRequest, ScheduleContract
from ...errors import ContractError
from ...schedule_rules import contract_value, describe_artifact
from ...sigmas import on_high_noise_expert
from ..distill_names import distill_contract

MOE_FAMILY = "wan2.2_moe"

# Distill artifacts: LightX2V / Lightning / Seko names carry the step count ("4step", "4steps", "8-steps").
_DISTILL_MARKER = re.compile(r"lightx2v|lightning|distill|seko", re.IGNORECASE)
_OTHER_FAMILY = re.compile(r"qwen|minimax", re.IGNORECASE)  # their Lightning/lightx2v files are not Wan's
_WAN22 = re.compile(r"wan[-_ .]?2[._]?2|a14b|high[-_]?noise|low[-_]?noise|moe|(?<![a-z])(high|low)(?![a-z])",
                    re.IGNORECASE)
# LightX2V configs (configs/distill/wan21|wan22/*.json) and the Wan2.2-Lightning reference configs all use
# sample_shift=5 with cfg off for these artifacts (reference §2.5, §2.9).
DISTILL_SHIFT = 5.0


def declared_contract(file_name: str, metadata: dict, rank: Optional[int]) -> Optional[ScheduleContract]:
    """``…lightx2v_4step…`` / ``…Lightning…8steps…`` -> N steps at shift 5, cfg 1. ``file_name`` may include
    its folder (Lightning ships ``<release>-4steps-.../high_noise_model.safetensors``). Names without a step
    count (e.g. ``…cfg_step_distill_lora_rank64``) declare nothing: the community runs them at several counts."""
    if not _DISTILL_MARKER.search(file_name) or _OTHER_FAMILY.search(file_name):
        return None
    # A name without an explicit version is Wan2.2 when it names an expert (high/low noise), else Wan2.1.
    family = MOE_FAMILY if _WAN22.search(file_name) else "wan2.1"
    return distill_contract(file_name, family, DISTILL_SHIFT, rank)



def check_expert_split(model, resolved: ResolvedSchedule, request: SamplingRequest, overrides: list) -> None:
    """A Wan2.2 distill pair is trained on a fixed expert split (lightx2v 4-step: 2 high-noise + 2 low-noise
    steps, reference §2.9), which the model's own ``boundary_ratio`` gives on the contract's sigmas. An explicit
    ``boundary`` input that moves a step to the other expert breaks the contract like a wrong step count."""
    model_boundary = getattr(model.model, "model_index", {}).get("boundary_ratio")
    if model.family != MOE_FAMILY or request.boundary is None or model_boundary is None:
        return
    split_by = [c for c in resolved.contracts if c.family == MOE_FAMILY and contract_value(c, "sigmas")]
    if not split_by:
        return
    steps = [float(s) for s in resolved.sigmas[:-1]]
    wanted = sum(on_high_noise_expert(s, float(model_boundary)) for s in steps)
    got = sum(on_high_noise_expert(s, float(request.boundary)) for s in steps)
    if wanted == got:
        return
    text = (f"boundary={request.boundary:g} runs {got} of {len(steps)} steps on the high-noise expert, but the "
            f"model's boundary_ratio {float(model_boundary):g} runs {wanted}")
    if request.enforce_contract:
        raise ContractError(f"{describe_artifact(split_by[0])}: {text} (set boundary to 0 to use the model's, or "
                            f"enforce_contract off to override it explicitly)")
    overrides.append(f"{text}; overrides {split_by[0].source}")
