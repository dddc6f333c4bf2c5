"""HTTP routes the editor asks while a workflow is being edited, served by ``lorabind serve`` and, inside
ComfyUI, through ``PromptServer`` (``comfy_bridge.add_server_routes``): one handler for both servers.

``GET /lorabind/contract?name=<name>[&folder=loras|diffusers]``: the sampling contract a LoRA file, PEFT folder
or MiniMax-H3 Turbo/native adapter (``loras``) or a diffusers model folder (``diffusers``: a pinned schedule or
baked-in contracts) declares, so the canvas can show it, and warn on the sampler, before anything runs. The
contract is a property of the file: the answer needs no graph and no loaded model. Names stay inside the
configured model folders (400 for ``..`` or absolute names, 404 for names that are not there).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..usecases import BUILTIN_NAMES, LoraBindError, lora_file_contract, model_folder_contract
from . import comfy_bridge
from .model_nodes import find_model_folder

CONTRACT_PATH = "/lorabind/contract"
MAX_NAME_CHARS = 1024  # a model name, not a document: longer query values are refused before any lookup


def _model_path(name: str):
    folder = find_model_folder(name)
    return None if folder is None else str(folder)


# folder kind -> (what it holds, in words; name -> path or None; (path, name) -> declaration)
_FOLDERS = {
    "loras": ("LoRA file or PEFT adapter folder", comfy_bridge.lora_full_path, lora_file_contract),
    "diffusers": ("diffusers model folder", _model_path, model_folder_contract),
}


def _answer(name: str, reason: str, status: int) -> web.Response:
    return web.json_response({"file": name, "family": None, "contract": None, "contracts": [], "reason": reason},
                             status=status)


async def get_declared_contract(request: web.Request) -> web.Response:
    """The declaration of one named file (``loaders.contracts``), or a JSON refusal with the reason."""
    name = request.query.get("name", "")
    kind = request.query.get("folder", "loras")
    if kind not in _FOLDERS:
        return _answer(name, f"folder {kind!r} is not one of {sorted(_FOLDERS)}", 400)
    if len(name) > MAX_NAME_CHARS:
        return _answer(name[:80] + "…", f"a name longer than {MAX_NAME_CHARS} characters is refused", 400)
    try:
        name = comfy_bridge.checked_model_name(kind, name)
    except ValueError as exc:
        return _answer(name, str(exc), 400)
    what, find, declaration = _FOLDERS[kind]
    path = find(name)
    if path is None and kind == "diffusers" and name in BUILTIN_NAMES:  # the loader builds it, so not an error
        return _answer(name, "a built-in tiny model that is not built yet: the loader builds it on first use, and "
                             "what it pins is known then", 200)
    if path is None:
        return _answer(name, f"no {what} named {name!r} in the {kind} folder", 404)
    try:
        report = await asyncio.to_thread(declaration, path, name)
    except LoraBindError as exc:  # a refused file (pickle, broken header, a contract it declares wrongly)
        return _answer(name, str(exc), 422)
    return web.json_response(report)


ROUTES = (("GET", CONTRACT_PATH, get_declared_contract),)
