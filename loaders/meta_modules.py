"""THE way a module without weights is built: from a component's config, or from parameter names and shapes.

Three places need a module that has every parameter's name and shape but holds no weight: the memory planner
(sizes from configs), the single-file loader (each tensor is then streamed from the file into its place) and
``lorabind merge`` (key accounting against a component it never loads). They build it here, the same way.

Parameters go to the meta device as they are registered (accelerate's ``init_empty_weights``, as diffusers'
own loaders do); buffers computed at construction, like rotary tables, stay real, so a module whose parameters
are then assigned runs. Constructors' warnings about their own deprecated pieces (weight_norm) say nothing to
a user of these modules and are silenced.
"""

from __future__ import annotations

import importlib
import warnings


def component_class(library: str, class_name: str):
    """The class a ``model_index`` entry or single-file kind names (``"diffusers"``, ``"AutoencoderKLWan"``);
    ImportError/AttributeError when the installed library lacks it (the caller names the file)."""
    return getattr(importlib.import_module(library), class_name)


def build_on_meta(cls, config: dict):
    """``cls`` configured by ``config`` (a ``config.json`` dict), parameters on the meta device, in eval mode.
    A diffusers ``ModelMixin`` is built with ``from_config``; a transformers model from its ``config_class``."""
    from accelerate import init_empty_weights

    with init_empty_weights(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if hasattr(cls, "from_config") and hasattr(cls, "load_config"):  # a diffusers ModelMixin
            module = cls.from_config(dict(config))
        else:
            config_obj = cls.config_class.from_dict(dict(config))
            module = cls._from_config(config_obj) if hasattr(cls, "_from_config") else cls(config_obj)
    # parameters re-created on the meta device lose their ties; transformers ties shared embeddings (umt5's
    # ``shared``/``encoder.embed_tokens``) when it loads, so tie them as a loaded model has them (outside the
    # context above, which would re-create the tied parameter)
    if hasattr(module, "tie_weights"):
        module.tie_weights()
    return module.eval()


def tree_on_meta(shapes: dict):
    """Nested plain modules with one meta parameter per ``{dotted parameter name: shape}``: ``named_modules`` and
    each module's own parameters are what the described model has, and nothing more. What key accounting reads
    of a model known only by names and shapes (``inspect --model`` from safetensors headers, a host's state
    dict)."""
    import torch

    root = torch.nn.Module()
    for key, shape in shapes.items():
        *path, leaf = key.split(".")
        module = root
        for part in path:
            child = module._modules.get(part)
            if child is None:
                child = torch.nn.Module()
                module.add_module(part, child)
            module = child
        module.register_parameter(leaf, torch.nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False))
    return root.eval()
