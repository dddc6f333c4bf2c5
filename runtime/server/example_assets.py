"""The example templates' cards (title, description) and their models, fixture LoRAs and input images, built when
``lorabind serve`` starts.

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
from ...loaders.io import json_limits
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


NOTE_TYPES = ("Note", "MarkdownNote")


def template_card(workflow: dict, name: str) -> dict:
    """The card of one UI template: its name, title and one-line description, read from its first note (the
    note's title, and the first line of its text). The note is where ComfyUI shows them too: ComfyUI's frontend
    (1.27 with 0.3.64, 1.47 with 0.30.0, 1.58) lists a pack's templates by file name only, title and description
    both, so the template itself carries them, in the first thing a user reads on opening it. Without a note,
    the name."""
    nodes = workflow.get("nodes") if isinstance(workflow, dict) else None
    note = next((n for n in nodes or () if isinstance(n, dict) and n.get("type") in NOTE_TYPES), None)
    values = (note or {}).get("widgets_values") or [""]
    text = values[0] if isinstance(values[0], str) else ""
    title = (note or {}).get("title")
    return {"name": name, "title": title if isinstance(title, str) and title else name,
            "description": text.split("\n", 1)[0].strip()}


def served_template_names(templates_dir: str) -> list[str]:
    """The templates of ``templates_dir`` (``workflows/``) the editor lists, in order."""
    folder = Path(templates_dir)
    return ordered_templates(path.name[: -len(".json")] for path in folder.glob("*.json")) if folder.is_dir() else []


def template_cards(templates_dir: str) -> list[dict]:
    """The editor's cards of the templates in ``templates_dir``, in listing order."""
    return [template_card(json_limits.loads((Path(templates_dir) / f"{name}.json").read_text(encoding="utf-8")),
                          name) for name in served_template_names(templates_dir)]


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
