"""lorabind: LoRA/adapter node pack for ComfyUI and a headless runtime.

ComfyUI imports this file by path and reads ``NODE_CLASS_MAPPINGS``, ``NODE_DISPLAY_NAME_MAPPINGS`` and
``WEB_DIRECTORY``. The node mappings are resolved lazily (PEP 562) so that ``lorabind --help`` and
``import lorabind`` stay fast: the node modules pull in torch only when ComfyUI or the runtime asks for them.
``Generator`` (the Python API, ``usecases.generator``) is resolved the same way, on a script's first use.
"""

WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]


def __getattr__(name):
    if name == "Generator":
        # the Python API loads torch and the engine when a script asks for it (ComfyUI never does); no host
        # lazy: ``import lorabind`` stays torch-free
        from .usecases.generator import Generator

        return Generator
    if name in ("NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"):
        # lazy: ComfyUI (or the runtime) asks for the nodes; ``import lorabind`` alone stays torch-free
        from . import nodes
        from .usecases import host

        host.install_builtin_models(_tiny_models)  # inside ComfyUI, its loader nodes offer the built-ins too

        return getattr(nodes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tiny_models():
    # lazy: the factory imports torch; called on the first use of a built-in model, not at import
    from . import tiny_models

    return tiny_models
