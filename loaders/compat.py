"""Which library versions each model family needs, checked where a family is first used.

Why: inside ComfyUI the user's environment decides the diffusers/transformers versions. Importing lorabind must
always work (every diffusers/transformers import is inside a function), and a family that needs a newer release
than the one installed must say so by name instead of failing deep inside diffusers with an ImportError,
TypeError or a silently dropped component.
"""

from __future__ import annotations

import re
from importlib import metadata

from .errors import ModelLoadError

# family -> {distribution: minimum version}; from checks against older releases (diffusers 0.32–0.35,
# transformers 4.46–4.57): WanPipeline appears in diffusers 0.33, its transformer_2/boundary_ratio (Wan2.2 MoE)
# and QwenImagePipeline in 0.35, Qwen2.5-VL text encoders in transformers 4.49, MiniMax-H3 in diffusers 0.42.
REQUIREMENTS = {
    "wan2.1": {"diffusers": "0.33"},
    "wan2.2_moe": {"diffusers": "0.35"},
    "wan2.2_ti2v": {"diffusers": "0.35"},  # expand_timesteps came with Wan2.2 in 0.35
    "qwen_image": {"diffusers": "0.35", "transformers": "4.49"},
    "minimax_h3": {"diffusers": "0.42"},
}

_LABELS = {"wan2.1": "Wan2.1", "wan2.2_moe": "Wan2.2 MoE", "wan2.2_ti2v": "Wan2.2 TI2V", "qwen_image": "Qwen-Image", "minimax_h3": "MiniMax-H3"}


def _numeric(version: str) -> tuple:
    """Leading numeric release parts: "0.42.1" -> (0, 42, 1), "5.0.0rc1" -> (5, 0, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def unmet_requirements(family: str) -> list[str]:
    """Human-readable unmet requirements of a family, e.g. ["diffusers >= 0.42 (installed 0.35.2)"]."""
    unmet = []
    for distribution, minimum in REQUIREMENTS.get(family, {}).items():
        installed = installed_version(distribution)
        if installed is None or _numeric(installed) < _numeric(minimum):
            unmet.append(f"{distribution} >= {minimum} (installed {installed or 'none'})")
    return unmet


def require(family: str, what: str = "") -> None:
    """Raise ModelLoadError naming the versions a family needs when the installed ones are older."""
    unmet = unmet_requirements(family)
    if unmet:
        subject = what or _LABELS.get(family, family)
        raise ModelLoadError(f"{subject} needs {' and '.join(unmet)}; upgrade with pip to use this model family")
