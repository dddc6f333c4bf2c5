"""What the Wan and Qwen-Image families share: distill LoRAs that declare their step count in the file name."""

from __future__ import annotations

import os
import re
from typing import Optional

from ..contract_types import ScheduleContract
from ..sigmas import shifted_sigmas

# "4step", "4steps", "8-steps", "4_step" (not "14steps" read as 4, not "4stepsize")
_STEPS = re.compile(r"(?<![0-9])(\d+)[-_ ]?steps?(?![a-z])", re.IGNORECASE)


def distill_contract(file_name: str, family: str, shift: float, rank: Optional[int]) -> Optional[ScheduleContract]:
    """N steps on ``shifted_sigmas(N, shift)`` at cfg 1 when ``file_name`` carries a step count N >= 1, else None."""
    steps_match = _STEPS.search(file_name)
    if steps_match is None or int(steps_match[1]) < 1:
        return None
    steps = int(steps_match[1])
    return ScheduleContract(source=os.path.basename(file_name), kind="distill", family=family, steps=steps,
                            sigmas=shifted_sigmas(steps, shift), shift=shift, cfg=1.0, rank=rank)
