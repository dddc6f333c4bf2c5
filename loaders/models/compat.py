"""Which library versions each model family needs, checked where a family is first used.

Why: inside ComfyUI the user's environment decides the diffusers/transformers versions. Importing lorabind must
always work (every diffusers/transformers import is inside a function), and a family that needs a newer release
than the one installed must say so by name instead of failing deep inside diffusers with an ImportError,
TypeError or a silently dropped component.
"""

from __future__ import annotations

import re
from importlib import metadata

from ..errors import ModelLoadError
from ..families import requirements_for


def _numeric(version: str) -> tuple:
    """Leading numeric release parts: "0.42.1" -> (0, 42, 1), "5.0.0rc1" -> (5, 0, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def unmet_requirements(family: str) -> list[str]:
    """Human-readable unmet requirements of a family's requirements id (``FamilyLayout.requirements``: the
    family owns its versions), e.g. ["diffusers >= 0.42 (installed 0.35.2)"]."""
    unmet = []
    for distribution, minimum in requirements_for(family)[0].items():
        installed = installed_version(distribution)
        if installed is None or _numeric(installed) < _numeric(minimum):
            unmet.append(f"{distribution} >= {minimum} (installed {installed or 'none'})")
    return unmet


def require(family: str, what: str = "") -> None:
    """Raise ModelLoadError naming the versions a family needs when the installed ones are older."""
    unmet = unmet_requirements(family)
    if unmet:
        subject = what or requirements_for(family)[1]
        raise ModelLoadError(f"{subject} needs {' and '.join(unmet)}; upgrade with pip to use this model family")
