"""HTTP routes the editor asks while a workflow is being edited, served by ``lorabind serve`` and, inside
ComfyUI, through ``PromptServer`` (``comfy_bridge.add_server_routes``): one handler for both servers.

``GET /lorabind/contract?name=<name>[&folder=loras|diffusers|diffusion_models]``: the sampling contract a LoRA
file, PEFT folder or MiniMax-H3 Turbo/native adapter (``loras``), a diffusers model folder (``diffusers``: a pinned
schedule or baked-in contracts) or a single denoiser file (``diffusion_models``: the contracts ``lorabind merge``
baked into it) declares, so the canvas can show it, and warn on the sampler, before anything runs. The
contract is a property of the file: the answer needs no graph and no loaded model. Names stay inside the
configured model folders (400 for ``..`` or absolute names, 404 for names that are not there). Files are read
in a worker pool with a timeout, and answers are cached by file identity (``contract_lookups``).
"""

from __future__ import annotations

from aiohttp import web

from ..usecases.verbs import builtin_model_names, lora_file_contract, model_file_contract, model_folder_contract
from . import comfy_bridge
from .contract_lookups import LOOKUPS, refusal
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
    "diffusion_models": ("single denoiser file", lambda name: comfy_bridge.model_file_path("diffusion_models", name),
                         model_file_contract),
}


def _answer(name: str, reason: str, status: int) -> web.Response:
    status, body = refusal(name, reason, status)
    return web.json_response(body, status=status)


async def get_declared_contract(request: web.Request) -> web.Response:
    """The declaration of one named file (``loaders.dispatch.contract_discovery``), or a JSON refusal with the
    reason."""
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
    if not name:  # "." or "./": the folder itself, which is no model
        return _answer(request.query["name"], f"the name must name a {what} inside the {kind} folder, not the "
                       "folder itself", 400)
    path = find(name)
    if path is None and kind == "diffusers" and name in builtin_model_names():  # the loader builds it, so not an error
        return _answer(name, "a built-in tiny model that is not built yet: the loader builds it on first use, and "
                             "what it pins is known then", 200)
    if path is None:
        return _answer(name, f"no {what} named {name!r} in the {kind} folder", 404)
    status, body = await LOOKUPS.answer(kind, name, path, declaration)
    return web.json_response(body, status=status)


ROUTES = (("GET", CONTRACT_PATH, get_declared_contract),)
