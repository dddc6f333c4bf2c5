"""What ``lorabind run`` prints about a prompt: validation errors by node and input, a failed node by its title
(or the ``--set`` values that changed it), and the files and texts the outputs hold. Plain text, no torch."""

from __future__ import annotations

import os


def format_node_errors(node_errors: dict) -> str:
    """One block per node (id and class), one line per error, each naming the input field it is about."""
    lines = []
    for node_id, entry in node_errors.items():
        lines.append(f"  node {node_id} ({entry.get('class_type')}):")
        for error in entry.get("errors", []):
            lines.append(f"    - {describe_error(error)}")
    return "\n".join(lines)


def describe_error(error: dict) -> str:
    """``input 'steps': Value -3 smaller than min of 1`` from a ComfyUI validation error.

    ComfyUI's ``details`` often just repeat the input name (``"steps"``) or start with it (``"steps, abc, ..."``);
    the name moves to the front and the repetition is dropped."""
    message, details = str(error.get("message", "")), str(error.get("details") or "")
    input_name = (error.get("extra_info") or {}).get("input_name")
    if not input_name:
        return f"{message}: {details}" if details else message
    for separator in (": ", ", ", " - "):
        if details.startswith(f"{input_name}{separator}"):
            details = details[len(input_name) + len(separator):]
            break
    if details == input_name:
        details = ""
    return f"input '{input_name}': {message}" + (f": {details}" if details else "")


def format_validation_failure(error: dict, node_errors: dict) -> str:
    header = f"lorabind run: {error.get('message')}"
    if node_errors:
        return header + "\n" + format_node_errors(node_errors)
    details = error.get("details")
    return f"{header}: {details}" if details else header


def format_execution_error(error: dict | None, prompt: dict | None = None, changed: dict | None = None) -> str:
    """``node 6 "Sampler" (LoraBindSampler) failed: Type: message`` — the title is what the user sees in the
    ComfyUI canvas, so it is shown when the workflow has one. For a node whose inputs ``--set`` changed
    (``changed``: {node_id: {"steps": 8, ...}}) the title may name the old values ("Sampler (4 steps)"), so the
    changed inputs are shown instead."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..workflow_overrides import describe_changes

    if not error:
        return "lorabind run: execution failed"
    message = str(error.get("exception_message", "")).strip()
    node_id = error.get("node_id")
    title = ((prompt or {}).get(node_id, {}).get("_meta") or {}).get("title")
    overridden = describe_changes(changed, node_id)
    if overridden:
        shown_title = f" (with --set {', '.join(overridden)})"
    else:
        shown_title = f' "{title}"' if title else ""
    return (f"lorabind run: node {node_id}{shown_title} ({error.get('node_type')}) failed: "
            f"{_short_type(error.get('exception_type'))}: {message}")


def _short_type(type_name) -> str:
    """``ContractError`` for ``lorabind.loaders.errors.ContractError``: the module path means nothing to a user."""
    return str(type_name or "").rsplit(".", 1)[-1]


VIDEO_SUFFIXES = (".mp4", ".webm")  # not runtime.server.media_types: importing it loads the server package (torch)


def _file_kind(ui_key: str, filename: str) -> str:
    """What a written file is, in the CLI's words: ComfyUI reports saved videos under ``images`` (the frontend
    tells them by suffix), which would read "wrote images: clip.mp4"."""
    return "video" if str(filename).lower().endswith(VIDEO_SUFFIXES) else ui_key


def describe_outputs(outputs: dict, prompt: dict, directory_of) -> list[str]:
    """Lines naming every file in the UI dicts (images, gifs, audio, ...) and any text previews. Each contract
    is shown once: a LoRA node's "contract: X" is left out when the sampler shows "contract enforced: X", and a
    text line an earlier node already showed is not repeated."""
    enforced = {entry.split(": ", 1)[1] for ui in outputs.values() for entry in ui.get("text") or []
                if isinstance(entry, str) and entry.startswith("contract enforced: ")}
    lines, shown_texts = [], set()
    for node_id, ui in outputs.items():
        label = f"node {node_id} ({prompt.get(node_id, {}).get('class_type')})"
        for key, entries in ui.items():
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, dict) and "filename" in entry:
                    root = directory_of(entry.get("type", "output")) or ""
                    path = os.path.join(root, entry.get("subfolder") or "", entry["filename"])
                    lines.append(f"{label} wrote {_file_kind(key, entry['filename'])}: {path}")
                elif key == "text" and entry not in shown_texts and not (
                        isinstance(entry, str) and entry.startswith("contract: ") and entry[10:] in enforced):
                    shown_texts.add(entry)
                    lines.append(f"{label} text: {entry}")
    if not lines:
        lines.append("done (no files written)")
    return lines
