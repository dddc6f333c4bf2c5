"""Our LoRA engine on a denoiser we did not load: one known only by its state dict's names and shapes (the model
a host such as ComfyUI holds, in the original checkpoint's "native" key layout).

Why from the state dict: a host's model may come from a full-precision file, an fp8 one, a GGUF quantisation or
another loader entirely, and its parameter names are whatever its own model class uses. The state dict is the one
thing every such model exposes, and its names are exactly what the host's patcher keys patches by. So the family
and key layout are recognised from the names (the single-file catalog's marker keys), each name is turned into
the diffusers path our key maps target (the layout's ``to_diffusers``), and a meta-device module tree with those
paths and shapes stands in for the model during ``prepare_lora``: the same read, map and key accounting as a fuse
into our own model, so a file is refused or accepted with the same words. The result is a table from the host's
own keys to our adapter kinds' deltas, which the host applies with its own patcher.

Beside ``lora/``, not in it: it recognises the host model with the single-file catalog and the family registry,
both of which import ``lora/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .. import families as family_registry
from ..errors import KeyMatchError
from ..lora.preparation import PreparedLora, prepare_lora
from ..meta_modules import tree_on_meta
from .single_file import catalog
from .single_file.key_prefixes import strip_prefix

HOST_COMPONENT = "diffusion_model"  # the component name our messages use for a host's denoiser


@dataclass(frozen=True)
class NativeDenoiser:
    """A host's denoiser as ``prepare_lora`` sees a model: ``name``, ``family`` (model family id) and
    ``components`` (one meta-device module tree under diffusers paths); ``host_keys`` maps each
    ``<diffusers module>.<parameter>`` to the host's state-dict key."""

    name: str
    family: str
    components: dict
    host_keys: dict

    @property
    def family_object(self):
        return family_registry.family_by_id(self.family)


def native_denoiser(shapes: Mapping[str, tuple], name: str) -> NativeDenoiser:
    """Recognise a host's denoiser from ``{state-dict key: shape}``; ``KeyMatchError`` naming ``name`` when no
    family we map has these names (the host model is some other architecture)."""
    own = {strip_prefix(key): (key, tuple(shape)) for key, shape in shapes.items() if strip_prefix(key) != key}
    if not own:
        own = {key: (key, tuple(shape)) for key, shape in shapes.items()}
    kind = next((kind for kind in catalog.kinds().values()
                 if kind.role == "denoiser" and kind.fits(own)), None)
    if kind is None:
        known = ", ".join(sorted({k.family for k in catalog.kinds().values() if k.role == "denoiser"}))
        raise KeyMatchError(f"{name}: its parameter names are not those of a denoiser lorabind maps LoRAs onto "
                            f"({known})")
    layout = kind.layout({})
    host_keys, param_shapes = {}, {}
    for native, (host_key, shape) in own.items():
        diffusers = layout.to_diffusers(native)
        host_keys[diffusers] = host_key
        param_shapes[diffusers] = shape
    family = family_registry.family_by_id(kind.family)
    return NativeDenoiser(name=name, family=family.model_families[0],
                          components={HOST_COMPONENT: tree_on_meta(param_shapes)}, host_keys=host_keys)


def prepare_native(path: str, denoiser: NativeDenoiser, *, name: str, lenient: bool, where: str) -> PreparedLora:
    """``prepare_lora`` against the host's denoiser: every file tensor accounted for (unmatched keys raise unless
    ``lenient``), nothing patched."""
    return prepare_lora(path, denoiser, HOST_COMPONENT, denoiser.family_object,
                        guess_family=family_registry.guess_family, name=name, lenient=lenient, where=where)


def host_deltas(prepared: PreparedLora, denoiser: NativeDenoiser) -> dict:
    """``{host state-dict key: (WeightDelta, ...)}``: every parameter the LoRA changes, under the host's name."""
    deltas = {}
    for module_path, patch in prepared.targets.items():
        for parameter, parameter_deltas in patch.parameter_deltas().items():
            deltas[denoiser.host_keys[f"{module_path}.{parameter}"]] = parameter_deltas
    return deltas
