"""The server's three folders keep one order: the plumbing (``runtime/server/``) imports neither API except in
``app``, which assembles them; ``comfy_api/`` imports nothing of ``openai/``; and ``openai/`` reaches ComfyUI's
API through its prompt service only, never through a route module (before: it imported ``validate_prompt`` from
``routes_prompt``). The folder-cycle check counts the three as one folder, so this is where their order lives."""

from __future__ import annotations

from test_package_structure import SERVER, _in, import_graph

COMFY_API = f"{SERVER}.comfy_api"
OPENAI = f"{SERVER}.openai"
ASSEMBLER = f"{SERVER}.app"
OPENAI_MAY_USE = {f"{COMFY_API}.prompt_service"}


def _breach(module: str, target: str) -> str | None:
    """Why ``module`` may not import ``target``, or None when the import keeps the order."""
    if _in(module, OPENAI):
        if _in(target, COMFY_API) and target not in OPENAI_MAY_USE:
            return "the OpenAI API uses ComfyUI's through its services only"
        return None
    if _in(module, COMFY_API):
        return "ComfyUI's API imports nothing of the OpenAI one" if _in(target, OPENAI) else None
    if _in(module, SERVER) and module != ASSEMBLER and (_in(target, COMFY_API) or _in(target, OPENAI)):
        return "only the app assembles the APIs; the plumbing sits below them"
    return None


def server_folder_breaches(graph: dict) -> list:
    """``importer -> imported: rule`` for each import that breaks the server's folder order."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            reason = _breach(module, target)
            if reason:
                found.append(f"{module} -> {target}: {reason}")
    return found


def test_the_server_folder_check_sees_each_breach():
    graph = {f"{OPENAI}.jobs": {f"{COMFY_API}.routes_prompt", f"{COMFY_API}.prompt_service", f"{SERVER}.queue"},
             f"{COMFY_API}.routes_info": {f"{OPENAI}.templates", f"{SERVER}.http_json"},
             f"{SERVER}.worker": {f"{COMFY_API}.user_files"},
             ASSEMBLER: {f"{COMFY_API}.routes_prompt", f"{OPENAI}.routes"}}
    assert server_folder_breaches(graph) == [
        f"{COMFY_API}.routes_info -> {OPENAI}.templates: ComfyUI's API imports nothing of the OpenAI one",
        f"{OPENAI}.jobs -> {COMFY_API}.routes_prompt: the OpenAI API uses ComfyUI's through its services only",
        f"{SERVER}.worker -> {COMFY_API}.user_files: only the app assembles the APIs; the plumbing sits below them"]


def test_the_server_folders_keep_their_order():
    graph = import_graph()
    assert f"{COMFY_API}.prompt_service" in graph[f"{OPENAI}.jobs"]  # the graph sees the new folders
    assert server_folder_breaches(graph) == []
