"""ComfyUI's own MODEL patched with a LoRA: the weight adapter our deltas ride on and what we read off a
ModelPatcher (its keys, shapes, dtypes, the file it came from). With comfy_bridge and comfy_guidance, the only
modules that touch ComfyUI, lazily: ``comfy`` is imported when the first patch is made, inside ComfyUI."""

from __future__ import annotations

import importlib
import os
from functools import lru_cache


@lru_cache(maxsize=1)
def _weight_patch_class():
    """A ComfyUI weight adapter whose value is computed by ``compute(weight, strength)``: ComfyUI's patcher calls it
    per weight when it loads, offloads or low-VRAM-streams the model, so our deltas follow its memory paths and
    nothing is computed before that. Loading, ComfyUI hands it the float32 weight and rounds the result; streaming
    (its low-VRAM patches, and every patched weight under 0.30.0's dynamic VRAM) it hands the weight in the compute
    dtype and uses the result as is, so the value goes back in the dtype it came in.

    The constructor is ComfyUI's adapters' own, ``(loaded_keys, weights)``, with ``(compute, label)`` as the
    weights: 0.30.0's dynamic-VRAM prefetch re-makes each adapter as ``type(patch)(patch.loaded_keys, staged
    weights)`` (``comfy.lora.prefetch_prepared_value``), which keeps non-tensor items as they are."""
    base = importlib.import_module("comfy.weight_adapter.base").WeightAdapterBase

    class LoraBindWeightPatch(base):
        name = "lorabind"

        def __init__(self, loaded_keys, weights):
            self.loaded_keys, self.weights = loaded_keys, weights
            self.compute, self.label = weights

        def calculate_weight(self, weight, key, strength, strength_model, offset, function,
                             intermediate_dtype=None, original_weight=None):
            return self.compute(weight, float(strength)).to(weight.dtype)

    return LoraBindWeightPatch


def add_weight_patches(model, computes: dict, strength: float, label: str) -> int:
    """Add ``{state-dict key: compute}`` to ``model`` (a ComfyUI ModelPatcher, already cloned) at ``strength``;
    returns how many keys were taken (every one, or the caller reports the difference).

    Why two routes: ComfyUI's patcher writes weight patches only into modules that hold all their parameters
    themselves (``ModelPatcher._load_list`` skips "random weights in non leaf modules"), so a patch on, say, a
    Wan block's own ``modulation`` (a LoRA's ``diff_m``) is accepted and then never applied. Those parameters get
    their patched value now, as object patches (ComfyUI swaps them in when it patches the model and back after);
    every other key stays a weight patch, computed when ComfyUI's patcher loads the weight."""
    patch_class = _weight_patch_class()
    weight_keys = [key for key in computes if _patcher_writes(model, key)]
    taken = len(model.add_patches({key: patch_class(set(), (computes[key], label)) for key in weight_keys},
                                  float(strength)))
    for key in computes.keys() - set(weight_keys):
        model.add_object_patch(key, _patched_parameter(model, key, computes[key], strength))
        taken += 1
    return taken


def _patcher_writes(model, key: str) -> bool:
    """Whether ComfyUI's weight patcher reaches ``key``: its module owns every parameter under it."""
    owner_path = key.rpartition(".")[0]
    owner = model.get_model_object(owner_path) if owner_path else model.model
    own = {name for name, _ in owner.named_parameters(recurse=False)}
    return all(name in own for name, _ in owner.named_parameters())


def _patched_parameter(model, key: str, compute, strength: float):
    """The parameter's patched value, from its value in this clone (an earlier LoRA node's object patch, else the
    model's own weight), in its own dtype and device."""
    import torch

    current = model.get_model_object(key)
    value = compute(current.detach().float(), float(strength)).to(device=current.device, dtype=current.dtype)
    return torch.nn.Parameter(value, requires_grad=False)


def patched_keys(model) -> set:
    """The state-dict keys a ComfyUI ModelPatcher already changes (weight patches and object patches)."""
    return set(model.patches) | set(model.object_patches)


def model_shapes(model) -> dict:
    """{state-dict key: shape} of a ComfyUI ModelPatcher's model, the names its patches are keyed by."""
    return {key: tuple(value.shape) for key, value in model.model_state_dict().items()}


def model_dtypes(model) -> dict:
    """{state-dict key: dtype name} of a ComfyUI ModelPatcher's model: what its patcher rounds a patched value to."""
    return {key: str(value.dtype) for key, value in model.model_state_dict().items()}


def model_file_name(model) -> str:
    """The name of the file a ComfyUI MODEL was loaded from, where ComfyUI keeps it: 0.30.0's loaders record how to
    load the model again (``cached_patcher_init``: the loader and its path). "" where it does not (0.3.64, other
    loaders). The name only: a path must not reach a message."""
    init = getattr(model, "cached_patcher_init", None)
    arguments = init[1] if isinstance(init, tuple) and len(init) > 1 and isinstance(init[1], tuple) else ()
    return os.path.basename(arguments[0]) if arguments and isinstance(arguments[0], str) else ""
