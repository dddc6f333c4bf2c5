"""The headless host's services, as the nodes see them when they do not run inside ComfyUI.

Why a port: nodes need a model-folder registry and the running node's execution context (progress, interrupt).
Inside ComfyUI those are ComfyUI's (``nodes.comfy_bridge``); headless they are the runtime's. The runtime imports
the nodes to run them, so the nodes must not import the runtime back: instead the runtime installs its services
here when it is imported (``runtime/__init__.py``), and the nodes ask this module. Torch-free: the CLI's fast
start imports it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

_services: dict = {"folder_paths": None, "current_context": None, "load_builtin_models": None, "builtin_models": None}


def install(*, folder_paths: Any, current_context: Callable[[], Any]) -> None:
    """Called by the runtime package on import: its ComfyUI-compatible registry and its context lookup."""
    _services.update(folder_paths=folder_paths, current_context=current_context)


def folder_paths():
    """The installed headless registry (``runtime.folder_paths``); a clear error when no host is there."""
    registry = _services["folder_paths"]
    if registry is None:
        raise RuntimeError("lorabind: no model registry: run the nodes inside ComfyUI, or import lorabind.runtime "
                           "(lorabind run / serve) to use its headless one")
    return registry


def current_context() -> Optional[Any]:
    """The execution context of the node running now (``runtime.context.ExecutionContext``), or None."""
    lookup = _services["current_context"]
    return lookup() if lookup is not None else None



def install_builtin_models(load_factory: Callable[[], Any]) -> None:
    """Called by a host (the runtime package, ComfyUI's entry in the pack's ``__init__``): how to reach the
    built-in tiny-model factory (``tiny_models``). Why a port: the factory is test and demo tooling, not the
    engine's or the use cases'; only a host decides to offer built-ins. Given as a loader because the factory
    imports torch and the CLI's fast start must not."""
    _services.update(load_builtin_models=load_factory, builtin_models=None)


def builtin_models() -> Optional[Any]:
    """The installed tiny-model factory (loaded on first use), or None: no host offers built-in models."""
    if _services["builtin_models"] is None and _services["load_builtin_models"] is not None:
        _services["builtin_models"] = _services["load_builtin_models"]()
    return _services["builtin_models"]
