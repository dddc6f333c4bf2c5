"""Node registry: every node module exports NODE_CLASS_MAPPINGS / NODE_DISPLAY_NAME_MAPPINGS; merged here.

Nodes are thin declarative adapters over ``loaders``: they declare inputs/outputs/tooltips and translate
between handles and library calls. Node names carry our prefix (or are unique to us) so they never collide
with ComfyUI core nodes.
"""

from importlib import import_module

from . import comfy_bridge, editor_routes

_NODE_MODULES = (
    "model_nodes",
    "checkpoint_nodes",
    "conditioning_nodes",
    "latent_nodes",
    "sampler_nodes",
    "sigma_nodes",
    "output_nodes",
    "video_nodes",
    "adapter_nodes",
    "minimax_nodes",
    "comfy_native_nodes",
)

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}

for _name in _NODE_MODULES:
    _module = import_module(f".{_name}", __name__)
    NODE_CLASS_MAPPINGS.update(_module.NODE_CLASS_MAPPINGS)
    NODE_DISPLAY_NAME_MAPPINGS.update(getattr(_module, "NODE_DISPLAY_NAME_MAPPINGS", {}))

# Inside ComfyUI its server answers the editor's routes too (headless, ``lorabind serve`` registers them itself),
# its unload / free-cache controls reach our models from the first prompt on, and a queued prompt finds the
# built-in files it names (the example templates') built, as headless.
comfy_bridge.add_server_routes(editor_routes.ROUTES)
comfy_bridge.follow_comfyui_memory_management()
comfy_bridge.build_builtins_on_prompt()
