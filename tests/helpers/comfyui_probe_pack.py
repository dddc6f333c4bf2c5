"""Test-only ComfyUI node pack, copied beside lorabind by ``real_comfyui.RealComfyUI``: a probe into the lorabind
pack's model store as ComfyUI loaded it, so a test can see what "Free model and node cache" left behind.

``GET /lorabind_probe/models`` -> ``{"loaded": [model names], "loads": {folder name: loads from disk}}``.
ComfyUI imports lorabind by path, so its modules are named after the pack folder; the probe finds the store by
that name's ending. It registers no nodes.
"""

import os
import sys

from aiohttp import web
from server import PromptServer

NODE_CLASS_MAPPINGS = {}


def _lorabind_model_store():
    for name, module in list(sys.modules.items()):
        if name.endswith("lorabind.loaders.models.store") and name != "lorabind.loaders.models.store":
            return module
    raise LookupError("the lorabind pack's model store is not imported")


@PromptServer.instance.routes.get("/lorabind_probe/models")
async def loaded_models(request):
    store = _lorabind_model_store()
    return web.json_response({
        "loaded": sorted(model.name for model in store.loaded_models()),
        "loads": {os.path.basename(path): count for path, count in store._load_counts.items()},
    })
