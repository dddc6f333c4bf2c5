"""Every forward hook lorabind puts on a module, in diffusers' hook registry: one place to add, find and remove them.

Four things run code around a module's forward: fp8 compute (``fp8``: the dequantized weight in place of the
stored fp8 bytes for the call), GGUF patches (``binding.dequant_patches``: the patched weight in place of the GGUF
bytes), placement (``placement.apply_plan``: bring a staged component up, move its inputs, start the decode
phase) and the step engine's per-row LoRA (``batching.row_lora``: a request's own low-rank product added to its
rows of a batched forward's output). Each is one ``LorabindHook`` named ``lorabind.<kind>`` in the module's ``HookRegistry`` (diffusers'
``ModelHook`` system, the ``_diffusers_hook`` attribute), and the hook object carries its kind's state, so no
module carries an attribute of ours.

Why diffusers' registry: group offload (``placement: blocks``) already hooks these modules through it, so all
hooks of a module form one chain with a defined order: a hook added later runs around the ones added before. fp8
compute is attached at load, before any placement, so a leaf-level group offload (text encoders) onloads first
and the dequantize reads the onloaded weight; as a torch pre-hook it ran before the onload (torch calls pre-hooks
before ``forward``, which diffusers replaces) and put in the layer a parameter that the streamed onload, which
looks each parameter up by identity, does not know. The chain also costs less per call than a torch pre-hook
plus an ``always_call`` forward hook (0.7 against 1.5 microseconds on the bench CPU). peft wraps a hooked layer
as its ``base_layer`` and calls it, so the hook still runs under an adapter.

What the registry does not give, and this module adds:

* a hook that swaps a weight in must put the stored one back even when the forward raises; diffusers calls
  ``post_forward`` only after a forward that returned, so ``LorabindHook`` wraps the forward (``new_forward``)
  and restores in ``finally``, as torch's ``always_call`` did;
* ``detach`` leaves the module as loaded: when our hook was the registry's last, diffusers leaves the registry
  attribute and an instance ``forward`` behind, and ``detach`` removes both.

Limits:

* diffusers' ``remove_hook`` re-links the hook above a removed one by replacing its ``fn_ref.forward``, which for
  a ``new_forward`` hook is the hook itself: a hook of ours must not sit above one that is later removed. None
  does: one hook of ours per module (fp8 and GGUF never share a layer; placement hooks sit on whole components and
  VAE decoders); group offload is attached after fp8 compute (above it) and never on a GGUF layer (GGUF is
  denoisers only, and denoisers offload by blocks); context parallelism (``--parallel ulysses/ring``:
  diffusers' split/gather hooks, the root one on a denoiser placement may also hook) is attached after
  placement (above it) and never removed. The one exception to "one hook of ours per module" is the per-row
  LoRA: it is attached for one batched forward, above everything, and detached right after it (``transient``).
* like every diffusers hook it replaces ``module.forward``, so it must not be removed from under an accelerate
  hook (lorabind attaches none: placement moves tensors with accelerate's ``send_to_device`` only).
* ``torch.compile`` traces through the chain, but not through a weight swap (it builds an ``nn.Parameter``;
  the GGUF patch also branches on data): the regional compile option (``placement.speed``, ``fullgraph``) fails
  on a block holding an fp8 or GGUF-patched layer, as it did with torch hooks; without ``fullgraph`` it runs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

PREFIX = "lorabind."
FP8_COMPUTE = PREFIX + "fp8_compute"
GGUF_PATCHES = PREFIX + "gguf_patches"
PLACEMENT_STAGE = PREFIX + "placement_stage"
PLACEMENT_DECODE = PREFIX + "placement_decode"
ROW_LORA = PREFIX + "row_lora"

_REGISTRY_ATTRIBUTE = "_diffusers_hook"  # where diffusers' HookRegistry keeps a module's hooks

Before = Callable[[Any, Any, tuple, dict], tuple]  # (module, state, args, kwargs) -> (args, kwargs)
After = Callable[[Any, Any], None]  # (module, state), also when the forward raised
Output = Callable[[Any, Any, tuple, Any], Any]  # (module, state, args, output) -> the output the caller gets


def attach(module, name: str, state: Any = None, before: Optional[Before] = None,
           after: Optional[After] = None, output: Optional[Output] = None, transient: bool = False) -> Any:
    """Run ``before`` and ``after`` around every forward of ``module`` as the hook ``name`` (``lorabind.<kind>``),
    and ``output`` on what a forward returned; ``state`` is what the kind keeps for this module (``state_of``
    finds it). Returns the hook. A second hook of ours on one module is refused (``ValueError``): the chain could
    not remove the lower one safely. A ``transient`` hook may sit above one of ours: it is the topmost and is
    detached before anything else is attached (the step engine's per-row LoRA, around one forward)."""
    from diffusers.hooks.hooks import HookRegistry

    registry = HookRegistry.check_if_exists_or_initialize(module)
    ours = [other for other in registry.hooks if other.startswith(PREFIX)]
    if ours and not transient:  # see "Limits" in the module docstring
        raise ValueError(f"{type(module).__name__} already has the hook {ours[0]}; one lorabind hook per module")
    hook = _hook_class()(state, before, after, output)
    registry.register_hook(hook, name)
    return hook


def state_of(module, name: str) -> Any:
    """The state of ``module``'s hook ``name``, or None when it has none (costs no import)."""
    registry = getattr(module, _REGISTRY_ATTRIBUTE, None)
    hook = registry.get_hook(name) if registry is not None else None
    return getattr(hook, "state", None)


def detach(module, name: str) -> None:
    """Remove ``module``'s hook ``name`` (a no-op without one); with no hook left, no registry and no forward
    override is left either."""
    registry = getattr(module, _REGISTRY_ATTRIBUTE, None)
    if registry is None or registry.get_hook(name) is None:
        return
    registry.remove_hook(name, recurse=False)
    if not registry.hooks:
        delattr(module, _REGISTRY_ATTRIBUTE)
        override = module.__dict__.get("forward")
        if getattr(override, "__self__", None) is module and \
                getattr(override, "__func__", None) is type(module).forward:
            del module.forward  # the bound method diffusers put back: the class's own forward again


@functools.cache
def _hook_class():
    """``LorabindHook``, built on first use: diffusers is imported only by a module that hooks something, and an
    install without ``diffusers.hooks`` (before 0.33) fails here with a message instead of at import."""
    try:
        from diffusers.hooks.hooks import ModelHook
    except ImportError as error:
        raise ImportError("lorabind's forward hooks need diffusers>=0.33 (diffusers.hooks.ModelHook); "
                          "upgrade diffusers") from error

    class LorabindHook(ModelHook):
        """``before``, the module's forward, then ``after`` in ``finally`` (also when ``before`` or the forward
        raised: it undoes whatever ``before`` did), each given the kind's ``state``."""

        def __init__(self, state, before, after, output):
            super().__init__()
            self.state, self.before, self.after, self.output = state, before, after, output

        def new_forward(self, module, *args, **kwargs):
            try:
                if self.before is not None:
                    args, kwargs = self.before(module, self.state, args, kwargs)
                result = self.fn_ref.original_forward(*args, **kwargs)
                return result if self.output is None else self.output(module, self.state, args, result)
            finally:
                if self.after is not None:
                    self.after(module, self.state)

    return LorabindHook
