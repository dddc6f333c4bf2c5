"""Stand-ins for the ComfyUI modules the pack reaches through ``nodes.comfy_bridge`` (ComfyUI is not installed
in the test environment): injected into ``sys.modules`` for one test, the bridge's module cache cleared."""

import sys
import types

from lorabind.nodes import comfy_bridge


def install_comfyui_modules(monkeypatch, folder_paths, utils=None, model_management=None):
    """Make ``folder_paths``, ``comfy.utils`` and ``comfy.model_management`` importable as ComfyUI's; the caller
    clears ``comfy_bridge._comfy_modules`` again when done (monkeypatch restores ``sys.modules``)."""
    comfy = types.ModuleType("comfy")
    comfy.utils = utils or types.SimpleNamespace()
    comfy.model_management = model_management or types.SimpleNamespace()
    for name, module in (("folder_paths", folder_paths), ("comfy", comfy), ("comfy.utils", comfy.utils),
                         ("comfy.model_management", comfy.model_management)):
        monkeypatch.setitem(sys.modules, name, module)
    comfy_bridge._comfy_modules.cache_clear()
