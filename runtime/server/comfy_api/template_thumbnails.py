"""One thumbnail per example template: the first frame of its own output on the tiny model, rendered after
``lorabind serve`` starts and kept in the state folder.

Why rendered and not committed (issue 30): the template browser showed the same placeholder for every template
(and logged a 404 per card); a picture of what each example makes tells them apart, and a set of images in the
repository would be large binaries that drift from the examples. Each template runs once, with its outputs in a
temporary folder, never the user's output folder. A template is rendered again only when its API prompt changes
(``index.json`` keeps each prompt's sha256 and what came of it, written after each one). A template that cannot
run (the mismatched-contract example is refused on purpose) gets none, and the log says so once: the browser
shows its placeholder.

Why one at a time below the user's prompts (issue 54): rendered all at once before the worker started, 21
thumbnails held the editor's first Run for minutes on a loaded machine. Each thumbnail is now its own piece of
background work (``PromptQueue.while_idle``): it starts only when no prompt is queued or running, and a prompt
queued meanwhile waits for that one thumbnail only, its log line saying so.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from ....loaders.io.video_files import first_video_frame, is_video_file
from ... import folder_paths
from ...executor import PromptExecutor
from ..example_assets import COMFYUI_ONLY_PREFIX

THUMBNAIL_FOLDER = "template_thumbnails"
THUMBNAIL_PIXELS = 256  # the card shows about 200 px; the tiny outputs are 32-64 px, enlarged without smoothing
INDEX = "index.json"
RENDERED = "rendered"


def thumbnail_folder(state_dir: str) -> Path:
    return Path(state_dir) / THUMBNAIL_FOLDER


def render_template_thumbnails(workflows_dir: str, state_dir: str, node_classes: dict,
                               announce: Callable[[str], None], when_idle=None) -> dict[str, str]:
    """Render what is missing or stale; {template: "rendered" | why not}. The runtime's folder_paths must be
    configured on the models and input folders; its output and temp folders are pointed elsewhere meanwhile.
    ``when_idle(label, work)``: runs each thumbnail's ``work`` when the server's queue is idle (``PromptQueue
    .while_idle``; None when the server stops first, which ends the rendering); default: at once."""
    folder = thumbnail_folder(state_dir)
    index_path = folder / INDEX
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.is_file() else {}
    todo = _stale(workflows_dir, folder, index)
    if not todo:
        return {}
    announce(f"rendering {len(todo)} template thumbnail(s) on the tiny models, one at a time while no prompt is "
             f"queued (once; kept in {folder})")
    folder.mkdir(parents=True, exist_ok=True)
    run = when_idle or (lambda label, work: work())
    results = {}
    with tempfile.TemporaryDirectory(prefix="lorabind-thumbnails-") as scratch:
        for count, (name, (api_path, digest)) in enumerate(todo.items(), 1):
            result = run(f"template thumbnail {name}",
                         lambda api_path=api_path, name=name: _render_one(api_path, folder / f"{name}.jpg",
                                                                          node_classes, scratch))
            if result is None:  # the server stopped
                break
            results[name] = result
            index[name] = {"sha256": digest, "result": result}
            index_path.write_text(json.dumps(index, indent=1, sort_keys=True), encoding="utf-8")
            announce(f"thumbnail {count}/{len(todo)} {name}" if result == RENDERED
                     else f"no thumbnail for {name} ({count}/{len(todo)}): {result}")
    return results


def _stale(workflows_dir: str, folder: Path, index: dict) -> dict:
    """{template: (its API file, its sha256)} of the templates whose thumbnail is missing or older than it."""
    todo = {}
    for api_path in sorted(Path(workflows_dir).glob("*.api.json")):
        name = api_path.name[:-len(".api.json")]
        if name.startswith(COMFYUI_ONLY_PREFIX):
            continue
        digest = hashlib.sha256(api_path.read_bytes()).hexdigest()
        known = index.get(name) or {}
        if known.get("sha256") != digest or (known.get("result") == RENDERED
                                             and not (folder / f"{name}.jpg").is_file()):
            todo[name] = (api_path, digest)
    return todo


def _render_one(api_path: Path, target: Path, node_classes: dict, scratch: str) -> str:
    saved = (folder_paths.output_directory, folder_paths.temp_directory)
    folder_paths.output_directory = folder_paths.temp_directory = scratch
    try:
        prompt = json.loads(api_path.read_text(encoding="utf-8"))
        executor = PromptExecutor(node_classes, cache=False)
        validation = executor.validate(prompt)
        if not validation.ok:
            return f"it does not validate ({validation.error.get('message')})"
        result = executor.execute(prompt, uuid.uuid4().hex, execute_outputs=validation.outputs)
        if not result.success:
            return f"it fails when run ({str((result.error or {}).get('exception_message', '')).strip()})"
        frame = _first_image(result.outputs, scratch)
        if frame is None:
            return "it writes no image"
        _save_thumbnail(frame, target)
        return RENDERED
    finally:
        folder_paths.output_directory, folder_paths.temp_directory = saved


def _first_image(outputs: dict, root: str):
    """The first frame of the first image file an output node wrote (animated WebP, MP4, WebM: their frame 0)."""
    from PIL import Image

    for ui in outputs.values():
        for entry in ui.get("images") or []:
            if isinstance(entry, dict) and "filename" in entry:
                path = Path(root, entry.get("subfolder") or "", entry["filename"])
                if is_video_file(path.name):
                    return first_video_frame(str(path)).convert("RGB")
                with Image.open(path) as image:
                    image.seek(0)
                    return image.convert("RGB")
    return None


def _save_thumbnail(frame, target: Path) -> None:
    from PIL import Image

    scale = max(1, THUMBNAIL_PIXELS // max(frame.size))
    enlarged = frame.resize((frame.width * scale, frame.height * scale), Image.NEAREST)
    staging = target.with_suffix(".partial.jpg")
    enlarged.save(staging, "JPEG", quality=90)
    staging.replace(target)
