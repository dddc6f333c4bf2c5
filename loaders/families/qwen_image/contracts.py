"""Qwen-Image sampling contracts: Lightning distill LoRAs declare N steps in their name."""

from __future__ import annotations

import re
from typing import Optional

from ...contract_types import ScheduleContract
from ..distill_names import distill_contract, with_metadata

_LIGHTNING = re.compile(r"lightning", re.IGNORECASE)
# Qwen-Image-Lightning's reference scheduler (README/"We use shift=3 in distillation") is FlowMatchEuler with
# exponential dynamic shifting and base_shift = max_shift = log(3): mu = log(3) whatever the image size, and the
# exponential shift exp(mu) / (exp(mu) + 1/t - 1) equals the rectified-flow shift k·t / (1 + (k-1)·t) with k=3.
# QwenImagePipeline feeds it the uniform grid linspace(1, 1/N, N) and the scheduler appends 0, so the schedule is
# exactly shifted_sigmas(N, 3.0) (4 steps: 1.0, 0.9, 0.75, 0.5, 0.0). cfg: true_cfg_scale=1.0 (reference §2.9).
LIGHTNING_SHIFT = 3.0


def declared_contract(file_name: str, metadata: dict, rank: Optional[int]) -> Optional[ScheduleContract]:
    """``Qwen-Image-Lightning-4steps-V1.0.safetensors`` (and the Edit/2509/2512/2511 variants) -> N steps,
    shift 3, cfg 1. A ``sampling_contract`` in the metadata wins over the name (``distill_names.with_metadata``)."""
    by_name = distill_contract(file_name, "qwen_image", LIGHTNING_SHIFT, rank) if _LIGHTNING.search(file_name) else None
    return with_metadata(by_name, file_name, metadata, "qwen_image", LIGHTNING_SHIFT, rank)

