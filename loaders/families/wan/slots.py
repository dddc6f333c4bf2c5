"""Which Wan2.2 expert a LoRA file belongs in: the file-name rule and the slot check, written once.

Why here: "``transformer`` is the high-noise expert, ``transformer_2`` the low-noise one" is Wan's convention, and
every place that puts a file into an expert (the fuse and pair nodes, ``lorabind merge``, ``lorabind inspect``)
asks the family through ``component_for_file`` / ``check_slots`` instead of knowing it.
"""

from __future__ import annotations

import re
from typing import Optional

from ...errors import ComponentUnnamedError, KeyMatchError

HIGH_NOISE_EXPERT = "transformer"
LOW_NOISE_EXPERT = "transformer_2"
EXPERT_OF_ROLE = {"high": HIGH_NOISE_EXPERT, "low": LOW_NOISE_EXPERT}


def expert_role(lora_name: str) -> Optional[str]:
    """"high" / "low" when the file name says which Wan2.2 expert it was trained for (``…high_noise…``,
    ``…_HIGH_…``, ``low_noise``, ``_LOW_``), None when it does not say (or says both)."""
    tokens = set(re.split(r"[^a-z0-9]+", lora_name.lower()))
    high, low = "high" in tokens, "low" in tokens
    if high == low:
        return None
    return "high" if high else "low"


def expert_for_file(file_name: str, *, strict: bool) -> str:
    """The expert a file's name says; without a word for it, the high-noise expert (``strict`` False) or a
    ``KeyMatchError`` asking for the component by name."""
    role = expert_role(file_name)
    if role is not None:
        return EXPERT_OF_ROLE[role]
    if not strict:
        return HIGH_NOISE_EXPERT
    raise ComponentUnnamedError(f"{file_name} does not say which expert of a Wan2.2 MoE model it is for; set its component "
                        f"to {HIGH_NOISE_EXPERT} (high noise) or {LOW_NOISE_EXPERT} (low noise)")


def check_slots(assignments: list, slot_names: Optional[dict] = None) -> None:
    """Refuse files whose names say the other expert, naming every one (and saying when a pair is swapped).
    ``assignments``: ``(component, file name, input name or "")``. ``slot_names`` ({component: name}) is what the
    caller's user sees for each expert (a ComfyUI node's ``model_high`` / ``model_low`` inputs), so the message
    speaks of those rather than of diffusers' component names."""
    wrong = [(component, name, where, role) for component, name, where in assignments
             if (role := expert_role(name)) is not None and component in EXPERT_OF_ROLE.values()
             and EXPERT_OF_ROLE[role] != component]
    if not wrong:
        return
    slot = {component: (slot_names or {}).get(component, component) for component in EXPERT_OF_ROLE.values()}
    words = "; ".join(f"{name} says {role} noise but goes into {slot[component]}" + (f" ({where})" if where else "")
                      for component, name, where, role in wrong)
    swapped = " (the pair is swapped)" if {w[3] for w in wrong} == {"high", "low"} else ""
    raise KeyMatchError(f"LoRA files in the wrong slots{swapped}: {words}; put high-noise files into "
                        f"{slot[HIGH_NOISE_EXPERT]} and low-noise files into {slot[LOW_NOISE_EXPERT]}")
