"""What a UI workflow's muted and bypassed nodes mean now that conversion follows the frontend we serve (1.58.1).

Why a note at all: an older frontend (and lorabind before issue 30) ran the inner nodes of a muted or bypassed
subgraph instance and passed links through a muted Reroute. Files saved then still open and run, but do less
than they used to, silently; ``lorabind run`` says so, naming each node, so a changed output has an explanation.
"""

from __future__ import annotations

from typing import Any

from .workflow_format import MODE_BYPASS, MODE_MUTED

MODE_WORDS = {MODE_MUTED: "muted", MODE_BYPASS: "bypassed"}


def older_frontend_differences(workflow: Any) -> list[str]:
    """One line per node whose conversion differs from an older frontend's (empty for an API prompt)."""
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), list):
        return []
    definitions = (workflow.get("definitions") or {}).get("subgraphs") or []
    subgraph_ids = {d.get("id") for d in definitions if isinstance(d, dict)}
    notes = _notes(workflow["nodes"], subgraph_ids, "")
    for definition in definitions:
        if isinstance(definition, dict):
            where = f" in subgraph '{definition.get('name') or definition.get('id')}'"
            notes += _notes(definition.get("nodes") or [], subgraph_ids, where)
    return notes


def _notes(nodes: list, subgraph_ids: set, where: str) -> list[str]:
    notes = []
    for node in nodes:
        if not isinstance(node, dict):
            continue
        word = MODE_WORDS.get(node.get("mode"))
        if word and node.get("type") in subgraph_ids:
            notes.append(f"node {node.get('id')}{where} is a {word} subgraph instance: none of its inner nodes "
                         "run (as ComfyUI's frontend 1.58.1 exports it; older frontends ran them)")
        elif word == "muted" and node.get("type") == "Reroute":
            notes.append(f"node {node.get('id')}{where} is a muted Reroute: the link through it is dropped (as "
                         "ComfyUI's frontend 1.58.1 exports it; older frontends passed it through)")
    return notes
