"""``serve --openai-model REPO_ID``: a repository id (``Wan-AI/Wan2.2-T2V-A14B-Diffusers``, ``Qwen/Qwen-Image``)
served through the real-size workflow of that model in ``workflows/real/``, as vllm-omni's ``serve REPO_ID``
serves a model by its id.

Why found by its files: the workflow whose denoiser files the model publishes (``loaders.placement.published``)
is that model's; no second table maps ids to workflows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ....loaders.io import json_limits
from ....loaders.io.shipped_configs import shipped_model_names
from ....loaders.placement.published import model_of, published_sources, repository_of
from ....usecases.model_check import FILE_INPUTS
from ..config import PACK_DIR

REAL_WORKFLOWS = PACK_DIR / "workflows" / "real"
DENOISER_FOLDER = "diffusion_models"


def repository_template(name: str) -> Optional[Path]:
    """The API workflow that serves the model a repository id names, or None (for anything else too: a bare
    configuration name such as ``qwen-image`` is a NAME=WORKFLOW pair missing its workflow)."""
    model = model_of(name) if name.count("/") == 1 else None
    if model is None or repository_of(model) != name:
        return None
    published = set(published_sources(model))
    for path in sorted(REAL_WORKFLOWS.glob("*.api.json")):
        denoisers = _denoiser_files(json_limits.loads(path.read_bytes()))
        if denoisers and denoisers <= published:
            return path
    return None


def served_repositories() -> list:
    """The repository ids a real workflow serves (for the message that names them)."""
    return [repository_of(m) for m in shipped_model_names() if repository_of(m) and repository_template(repository_of(m))]


def _denoiser_files(prompt: dict) -> set:
    return {f"{DENOISER_FOLDER}/{value}" for node in prompt.values() if isinstance(node, dict)
            for key, value in (node.get("inputs") or {}).items()
            if FILE_INPUTS.get(key) == DENOISER_FOLDER and isinstance(value, str) and value != "none"}
