"""Qwen-Image sampling contracts: Lightning distill LoRAs declare N steps in their name."""

from __future__ import annotations

import os
import re
from typing import Optional

from ...contract_types import ScheduleContract
from ...contracts.distill_names import declared, distill_contract, open_contract
from ...errors import ContractError

_LIGHTNING = re.compile(r"lightning", re.IGNORECASE)
# Qwen-Image-Lightning's reference scheduler (README/"We use shift=3 in distillation") is FlowMatchEuler with
# exponential dynamic shifting and base_shift = max_shift = log(3): mu = log(3) whatever the image size, and the
# exponential shift exp(mu) / (exp(mu) + 1/t - 1) equals the rectified-flow shift k·t / (1 + (k-1)·t) with k=3.
# QwenImagePipeline feeds it the uniform grid linspace(1, 1/N, N) and the scheduler appends 0, so the schedule is
# exactly shifted_sigmas(N, 3.0) (4 steps: 1.0, 0.9, 0.75, 0.5, 0.0). cfg: true_cfg_scale=1.0 (reference §2.9).
LIGHTNING_SHIFT = 3.0


# Qwen-Image-2512-Lightning.safetensors, the vllm-omni LoRA guide's own example (docs/user_guide/diffusion/lora.md,
# distill backend table), names no step count: the release has 4- and 8-step files. Shift 3 and cfg 1 hold for
# every Lightning file, so only the step count is left open.
LIGHTNING_STEPS_OPEN_NOTE = "its name carries no step count: steps are left open (Lightning releases 4- and 8-step files)"


def declared_contract(file_name: str, metadata: dict, rank: Optional[int],
                      table=None) -> Optional[ScheduleContract]:
    """``Qwen-Image-Lightning-4steps-V1.0.safetensors`` (and the Edit/2509/2512/2511 variants) -> N steps,
    shift 3, cfg 1; a Lightning name without a step count pins shift 3 and cfg 1 and leaves the steps open.
    Only the file's own name is read. The metadata wins over a contract table entry, which wins over the name
    (``distill_names.declared``)."""
    name = os.path.basename(str(file_name).replace("\\", "/").rstrip("/"))
    by_name = None
    if _LIGHTNING.search(name):
        by_name = distill_contract(name, "qwen_image", LIGHTNING_SHIFT, rank) or open_contract(
            name, "qwen_image", rank, ("steps",), LIGHTNING_STEPS_OPEN_NOTE, shift=LIGHTNING_SHIFT, cfg=1.0)
    return declared(by_name, name, metadata, table, "qwen_image", rank)


# The Lightning edit releases (reference §2.6): lightx2v/Qwen-Image-Lightning's
# Qwen-Image-Edit-Lightning-4steps-V1.0 and Qwen-Image-Edit-2509/Qwen-Image-Edit-2509-Lightning-{4,8}steps-V1.0-bf16,
# and lightx2v/Qwen-Image-Edit-2511-Lightning's Qwen-Image-Edit-2511-Lightning-4steps-V1.0-{fp32,bf16}. Their names
# carry the step count the same way, and the release samples them with the same FlowMatchEuler set-up as the
# text-to-image files (shift 3, true_cfg_scale 1; §2.9), so ``declared_contract`` reads them unchanged. What the
# name adds is the model it was distilled on: an edit file on the text-to-image model, or the reverse, would fuse
# the distillation of another model (same transformer shapes, so nothing else would notice).
_EDIT_FILE = re.compile(r"qwen[-_ ]?image[-_ ]?edit", re.IGNORECASE)
TEXT_TO_IMAGE, IMAGE_EDIT = "text-to-image", "image-editing"


def lightning_task(file_name: str) -> Optional[str]:
    """IMAGE_EDIT for a Qwen-Image-Edit Lightning file, TEXT_TO_IMAGE for another Lightning file, None for a
    file whose name is not a Lightning release's."""
    name = os.path.basename(str(file_name).replace("\\", "/").rstrip("/"))
    if not _LIGHTNING.search(name):
        return None
    return IMAGE_EDIT if _EDIT_FILE.search(name) else TEXT_TO_IMAGE


def check_lightning_task(model, file_name: str, component: str, model_edits: bool) -> None:
    """Refuse (ContractError naming both) a Lightning edit file on a text-to-image model and the reverse."""
    task = lightning_task(file_name)
    model_task = IMAGE_EDIT if model_edits else TEXT_TO_IMAGE
    if task is None or task == model_task:
        return
    other = "Qwen-Image-Edit" if task == IMAGE_EDIT else "Qwen-Image (text-to-image)"
    raise ContractError(f"{os.path.basename(file_name)} is a Lightning LoRA distilled on {other}, but "
                        f"{model.name} ({component}) is the {model_task} model: the transformers have the same "
                        f"shapes, so it would fuse another model's distillation; use the {model_task} Lightning "
                        f"file here")
