"""Our LoRA engine on a denoiser we did not load: one known only by its state dict's names and shapes (the model
a host such as ComfyUI holds, in the original checkpoint's "native" key layout).

Why from the state dict: a host's model may come from a full-precision file, an fp8 one, a GGUF quantisation or
another loader entirely, and its parameter names are whatever its own model class uses. The state dict is the one
thing every such model exposes, and its names are exactly what the host's patcher keys patches by. So the family
and key layout are recognised from the names (the single-file catalog's marker keys, or a family's host-only
denoisers: MiniMax-H3, whose files we do not load but ComfyUI 0.30 does), each name is turned into the diffusers
paths our key maps target (the layout's ``diffusers_parts``: one, or the parts of a fused native tensor such as
MiniMax-H3's ``qkv_proj``), and a meta-device module tree with those paths and shapes stands in for the model
during ``prepare_lora``: the same read, map and key accounting as a fuse into our own model, so a file is refused
or accepted with the same words. The result is a ``HostPatch`` per host key, which the host applies with its own
patcher: its value is each part's fuse in the host's dtype, joined back (bit for bit our fuse's value).

Beside ``lora/``, not in it: it recognises the host model with the single-file catalog and the family registry,
both of which import ``lora/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from .. import families as family_registry
from ..binding.patching import patched_value
from ..errors import KeyMatchError
from ..io.key_layouts import KeyLayout
from ..lora.preparation import PreparedLora, prepare_lora
from ..meta_modules import tree_on_meta
from .single_file import catalog
from .single_file.key_prefixes import strip_prefix

HOST_COMPONENT = "diffusion_model"  # the component name our messages use for a host's denoiser
# the host dtypes a patched value is rounded to here, as our own fuse rounds it (others stay float32: the host's
# patcher stores them its own way, an fp8 scale for one)
_ROUNDED_HERE = ("torch.bfloat16", "torch.float16", "torch.float32")


@dataclass(frozen=True)
class NativeDenoiser:
    """A host's denoiser as ``prepare_lora`` sees a model: ``name``, ``family`` (model family id) and
    ``components`` (one meta-device module tree under diffusers paths); ``host_keys`` maps each
    ``<diffusers module>.<parameter>`` to the host's state-dict key, ``parts`` each host key to the diffusers keys
    it holds (several for a fused native tensor: MiniMax-H3's ``qkv_proj``), ``layout`` cuts and joins them."""

    name: str
    family: str
    components: dict
    host_keys: dict
    parts: dict
    layout: KeyLayout
    dtypes: dict

    @property
    def family_object(self):
        return family_registry.family_by_id(self.family)


@dataclass(frozen=True)
class HostPatch:
    """What one LoRA changes in one host parameter: ``(diffusers key, deltas)`` for each diffusers parameter the
    host tensor holds, in the layout's join order (deltas () for a part the LoRA leaves alone)."""

    native_key: str
    parts: tuple
    layout: KeyLayout
    dtype: str = ""

    @property
    def deltas(self) -> tuple:
        return tuple(delta for _, part_deltas in self.parts for delta in part_deltas)

    def value(self, original, strength: float):
        """The float32 value of the patched host parameter from its unpatched value ``original``: each part is
        computed as our own fuse computes it in the host's dtype (so the host's rounding to that dtype changes
        nothing: the same bits as our fuse), then the parts are joined back into the host's tensor."""
        import torch

        dtype = getattr(torch, self.dtype.removeprefix("torch.")) if self.dtype in _ROUNDED_HERE else torch.float32
        keys = tuple(key for key, _ in self.parts)
        pieces = self.layout.split(self.native_key, original.to(dtype), keys)
        for key, part_deltas in self.parts:
            if part_deltas:
                pieces[key] = patched_value(pieces[key].contiguous(), part_deltas, strength, dtype=dtype)
        return self.layout.join(self.native_key, [pieces[key] for key in keys]).float()


def _host_kind(own: dict, name: str):
    """The denoiser kind or host-only denoiser whose marker keys the host's names have."""
    kind = next((kind for kind in catalog.kinds().values() if kind.role == "denoiser" and kind.fits(own)), None)
    if kind is not None:
        return kind.family, kind.layout({})
    host = next((host for host in catalog.host_denoisers() if host.fits(own)), None)
    if host is not None:
        return host.family, host.layout
    known = ", ".join(sorted({k.family for k in catalog.kinds().values() if k.role == "denoiser"}
                             | {h.family for h in catalog.host_denoisers()}))
    raise KeyMatchError(f"{name}: its parameter names are not those of a denoiser lorabind maps LoRAs onto "
                        f"({known})")


def native_denoiser(shapes: Mapping[str, tuple], name: str, dtypes: Optional[Mapping[str, str]] = None, *,
                    expert: bool = False) -> NativeDenoiser:
    """Recognise a host's denoiser from ``{state-dict key: shape}`` (and ``{key: dtype name}``, the dtypes the host
    stores them in); ``KeyMatchError`` naming ``name`` when no family we map has these names. ``expert``: the host
    says it is one expert of a two-expert model (a Wan2.2 A14B expert has a Wan2.1 14B's shapes), so it carries
    that model's family id, which every message names."""
    own = {strip_prefix(key): (key, tuple(shape)) for key, shape in shapes.items() if strip_prefix(key) != key}
    if not own:
        own = {key: (key, tuple(shape)) for key, shape in shapes.items()}
    family_id, layout = _host_kind(own, name)
    host_keys, param_shapes, parts = {}, {}, {}
    for native, (host_key, shape) in own.items():
        held = layout.diffusers_parts(native)
        rows = shape[0] // len(held) if shape else 0
        for diffusers in held:
            host_keys[diffusers] = host_key
            param_shapes[diffusers] = (rows, *shape[1:]) if len(held) > 1 else shape
        parts[host_key] = (native, held)
    family = family_registry.family_by_id(family_id)
    model_family = (expert and family.layout.expert_model_family) or family.model_families[0]
    return NativeDenoiser(name=name, family=model_family,
                          components={HOST_COMPONENT: tree_on_meta(param_shapes)}, host_keys=host_keys,
                          parts=parts, layout=layout, dtypes=dict(dtypes or {}))


def prepare_native(path: str, denoiser: NativeDenoiser, *, name: str, lenient: bool, where: str) -> PreparedLora:
    """``prepare_lora`` against the host's denoiser: every file tensor accounted for (unmatched keys raise unless
    ``lenient``), nothing patched."""
    return prepare_lora(path, denoiser, HOST_COMPONENT, denoiser.family_object,
                        guess_family=family_registry.guess_family, name=name, lenient=lenient, where=where)


def host_deltas(prepared: PreparedLora, denoiser: NativeDenoiser) -> dict:
    """``{host state-dict key: HostPatch}``: every host parameter the LoRA changes, with its parts' deltas."""
    changed = {}
    for module_path, patch in prepared.targets.items():
        for parameter, parameter_deltas in patch.parameter_deltas().items():
            changed[f"{module_path}.{parameter}"] = tuple(parameter_deltas)
    patches = {}
    for host_key in dict.fromkeys(denoiser.host_keys[key] for key in changed):
        native, held = denoiser.parts[host_key]
        patches[host_key] = HostPatch(native, tuple((key, changed.get(key, ())) for key in held), denoiser.layout,
                                      denoiser.dtypes.get(host_key, ""))
    return patches
