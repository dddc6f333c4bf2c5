"""The example templates' models, fixture LoRAs and input images, built when ``lorabind serve`` starts.

Why at start and not on the first prompt (as before issue 30): the editor lists and opens the templates before
anything is queued, and a template that names a file which does not exist yet opens with red nodes and
"missing model" warnings, so every example looked broken until it had run once. Building is offline, writes only
the built-in folders (``diffusers/tiny-*``, ``loras/lorabind-tiny/``, ``input/lorabind-tiny/``...) and only
what is missing; the log says what is built and why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

from ...loaders.families import example_order
from ...tiny_models import ensure_builtin_models

# comfy_*: the ComfyUI-native examples (ComfyUI's core loaders and samplers with our LoRA nodes) run only inside
# ComfyUI, so the headless editor neither lists them nor renders their thumbnails.
COMFYUI_ONLY_PREFIX = "comfy_"


def ordered_templates(names: Iterable[str]) -> list[str]:
    """``names`` by importance, the ones it does not know after them, A-Z; the ComfyUI-only examples are left out.
    The template browser lists ours in the order /workflow_templates gives (frontend 1.58.1 sorts templates without
    a date or usage count stably), so this is the order a newcomer meets them: each family says which of its
    examples come first (``families.example_order``)."""
    rank = {name: index for index, name in enumerate(example_order())}
    served = [name for name in names if not name.startswith(COMFYUI_ONLY_PREFIX)]
    return sorted(served, key=lambda name: (rank.get(name, len(rank)), name))


def prepare_example_assets(workflows_dir: str, models_root: str, input_dir: str,
                           announce: Callable[[str], None]) -> list[str]:
    """Build what the served examples (``*.api.json`` beside each template) name and is missing; the names built."""
    prompt = {}
    for path in sorted(Path(workflows_dir).glob("*.api.json")):
        for node_id, node in json.loads(path.read_text(encoding="utf-8")).items():
            prompt[f"{path.name}:{node_id}"] = node
    return ensure_builtin_models(
        prompt, models_root, input_dir,
        announce=lambda line: announce(f"{line}, for the example templates the editor lists"))
