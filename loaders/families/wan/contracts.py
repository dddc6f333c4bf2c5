"""Wan2.1 / Wan2.2 sampling contracts: distill LoRAs (LightX2V, Lightning, Seko) declare N steps in their name."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Optional

from ...contract_types import ResolvedSchedule, SamplingRequest, ScheduleContract
from ...contracts.distill_names import declared, distill_contract, open_contract
from ...contracts.schedule_rules import contract_value, refuse_or_record
from ...contracts.sigmas import on_high_noise_expert
from ...errors import ContractError
from .. import named_for_another_family

MOE_FAMILY = "wan2.2_moe"

# Distill artifacts: LightX2V / Lightning / Seko names carry the step count ("4step", "4steps", "8-steps").
_DISTILL_MARKER = re.compile(r"lightx2v|lightning|distill|seko", re.IGNORECASE)
_WAN22 = re.compile(r"wan[-_ .]?2[._]?2|a14b|high[-_]?noise|low[-_]?noise|moe|(?<![a-z])(high|low)(?![a-z])",
                    re.IGNORECASE)
# LightX2V configs (configs/distill/wan21|wan22/*.json) and the Wan2.2-Lightning reference configs all use
# sample_shift=5 with cfg off for these artifacts (reference §2.5, §2.9).
DISTILL_SHIFT = 5.0


# The Wan2.2 I2V A14B lightx2v pair (``wan2.2_i2v_A14b_{high,low}_noise_lora_rank64_lightx2v_4step_1022``): what
# the published recipes say, field by field.
# - steps 4: LightX2V ``configs/distill/wan22/wan_moe_i2v_distill_with_lora.json`` ("infer_steps": 4,
#   "denoising_step_list": [1000, 750, 500, 250]) and vllm-omni's LoRA guide (docs/user_guide/diffusion/lora.md,
#   offline run: --num-inference-steps 4) agree. Pinned.
# - cfg 1: LightX2V "enable_cfg": false; vllm-omni --guidance-scale 1.0 --guidance-scale-high 1.0. Pinned.
# - shift: LightX2V "sample_shift": 5.0 (timesteps 1000, 937.5, 833.3, 625); vllm-omni --flow-shift 12 (480x832,
#   81 frames). The sources disagree, so the shift (and with it the sigma list) is not pinned; the note says so.
# - expert split: LightX2V "boundary_step_index": 2 (2 high-noise + 2 low-noise steps); vllm-omni
#   --boundary-ratio 0.875 (3 + 1 at shift 12); Wan2.2-I2V-A14B's own boundary_ratio 0.9. Not pinned: the
#   model's boundary applies unless the sampler's boundary input says otherwise.
I2V_PAIR_NOTE = ("published recipes differ on shift and expert split: LightX2V samples at shift 5 with 2 high-noise "
                 "+ 2 low-noise steps, vllm-omni's LoRA guide at flow shift 12 with boundary 0.875; both are allowed")
_I2V = re.compile(r"(?<![a-z0-9])i2v(?![a-z0-9])", re.IGNORECASE)
_T2V = re.compile(r"(?<![a-z0-9])t2v(?![a-z0-9])", re.IGNORECASE)
_LIGHTX2V = re.compile(r"lightx2v", re.IGNORECASE)
# LightX2V's release layout: one folder per release, the experts under generic names (reference §2.6:
# lightx2v/Wan2.2-Lightning/<release>/{high,low}_noise_model.safetensors).
_RELEASE_LAYOUT = re.compile(r"(high|low)_noise_model\.safetensors", re.IGNORECASE)
_CAUSVID = re.compile(r"causvid", re.IGNORECASE)
# A step-and-CFG distill name without a step count (Kijai's lightx2v_T2V_14B_cfg_step_distill_v2_lora_rank64_bf16,
# LightX2V's Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32): LightX2V's step distillation is trained for
# 4 steps "without CFG" (LightX2V docs, method_tutorials/step_distill), so cfg 1 is pinned; the community runs
# these files at 4 to 8 steps and several shifts, so those are left to the user.
STEPS_OPEN_NOTE = ("its name carries no step count: steps and shift are left open (LightX2V distills these for "
                   "4 steps without CFG; people run them at 4 to 8)")
# CausVid LoRAs (Kijai's Wan21_CausVid_14B_T2V_lora_rank32*, Wan21_CausVid_bidirect2_T2V_1_3B_lora_rank32): the
# release notes and community tests run them at 4 to 12 steps, cfg 1 up to about 3, at reduced strength; no
# field is fixed by the release.
CAUSVID_NOTE = ("a CausVid LoRA: steps, shift and cfg are left open (its release runs it at 4 to 12 steps, "
                "cfg 1 to 3)")


def declared_contract(file_name: str, metadata: dict, rank: Optional[int],
                      table=None) -> Optional[ScheduleContract]:
    """``…lightx2v_4step…`` / ``…Lightning…8steps…`` -> N steps at shift 5, cfg 1. ``file_name`` may include
    its folder: LightX2V's release layout (``Wan2.2-…-4steps-…-Seko-V1.1/high_noise_model.safetensors``) keeps
    the step count in the folder name; for any other file only its own name counts (a folder the user named
    "lightx2v" does not make every LoRA in it a distill file). A distill name without a step count
    (``…cfg_step_distill_lora_rank64``, CausVid) gets a contract that says which fields it leaves open. The
    Wan2.2 I2V lightx2v pair pins steps and cfg only (see ``I2V_PAIR_NOTE``). The file's metadata wins over a
    contract table entry (``table``), which wins over the name (``distill_names.declared``)."""
    text = _grammar_text(file_name)
    # A name without an explicit version is Wan2.2 when it names an expert (high/low noise), else Wan2.1.
    family = MOE_FAMILY if _WAN22.search(text) else "wan2.1"
    return declared(_by_name(text, family, rank), text, metadata, table, family, rank)


def _grammar_text(file_name: str) -> str:
    """The part of a loras-relative name the grammar reads: the file name, with its folder for the release
    layout's generic ``high_noise_model`` / ``low_noise_model`` names."""
    parts = str(file_name).replace("\\", "/").rstrip("/").split("/")
    if len(parts) > 1 and _RELEASE_LAYOUT.fullmatch(parts[-1]):
        return "/".join(parts[-2:])
    return parts[-1]


def _by_name(text: str, family: str, rank: Optional[int]) -> Optional[ScheduleContract]:
    if named_for_another_family(text, "wan"):  # other families' Lightning/lightx2v files are not Wan's
        return None
    if _CAUSVID.search(text):
        return open_contract(text, family, rank, ("steps", "shift", "cfg"), CAUSVID_NOTE)
    by_steps = distill_contract(text, family, DISTILL_SHIFT, rank)
    if not (_DISTILL_MARKER.search(text) or (by_steps is not None and _RELEASE_LAYOUT.search(text))):
        return None
    if by_steps is None:
        by_steps = open_contract(text, family, rank, ("steps", "shift"), STEPS_OPEN_NOTE, cfg=1.0)
    if artifact_task(text) == "i2v":
        by_steps = replace(by_steps, tasks=("i2v",))
        if family == MOE_FAMILY and _LIGHTX2V.search(text) and by_steps.steps is not None:
            by_steps = replace(by_steps, sigmas=None, shift=None, extra=(("note", I2V_PAIR_NOTE),))
    return by_steps


def artifact_task(file_name: str) -> Optional[str]:
    """"i2v" / "t2v" when a Wan file name says which kind of model it was trained on, else None."""
    i2v, t2v = bool(_I2V.search(file_name)), bool(_T2V.search(file_name))
    return None if i2v == t2v else ("i2v" if i2v else "t2v")


def check_artifact_fits(model, file_name: str, component: str, model_kind: str) -> None:
    """An I2V LoRA on a text-to-video expert, or a T2V LoRA on an image-to-video one, is refused naming both:
    their experts differ (36 vs 16 input channels, the image branch), so the keys that do match would fuse a
    distillation of the other model. ``model_kind`` is the model's "t2v", "i2v", "i2v_clip" or "ti2v" (TI2V-5B
    does both and takes either)."""
    task = artifact_task(file_name)
    if task is None or model_kind == "ti2v" or (task == "i2v") == (model_kind != "t2v"):
        return
    kinds = {"i2v": "an image-to-video (I2V)", "t2v": "a text-to-video (T2V)"}
    model_task = "t2v" if model_kind == "t2v" else "i2v"
    raise ContractError(f"{file_name} is {kinds[task]} LoRA but {model.name} ({component}) is {kinds[model_task]} "
                        f"model: their experts differ, so it would fuse another model's distillation; use the "
                        f"{model_task} file of this release here, or this file on {kinds[task]} model")


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
    refuse_or_record(split_by[0], text, request.enforce_contract, overrides,
                     "set boundary to 0 to use the model's; ")
