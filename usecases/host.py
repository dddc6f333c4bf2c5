"""The headless host's services, as the nodes see them when they do not run inside ComfyUI.

Why a port: nodes need a model-folder registry and the running node's execution context (progress, interrupt).
Inside ComfyUI those are ComfyUI's (``nodes.comfy_bridge``); headless they are the runtime's. The runtime imports
the nodes to run them, so the nodes must not import the runtime back: instead the runtime installs its services
here when it is imported (``runtime/__init__.py``), and the nodes ask this module. Torch-free: the CLI's fast
start imports it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

_services: dict = {"folder_paths": None, "current_context": None}


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
