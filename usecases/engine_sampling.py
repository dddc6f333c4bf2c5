"""A sampler's denoise through the process's step engine (``loaders.batching``), when a host installed one.

Why here: ``sample`` settles everything that can refuse a run before any weight is written; this is the part
after that, for a served request. Its LoRA files are read and checked on its own thread first (a bad file fails
it alone, before it joins a batch); then its loop runs with its forwards in the engine, which binds what the
batch needs. A strength schedule changes the request's binding between steps, which the engine takes up at its
next forward; such a request shares no batch.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..loaders.batching.bindings import Binding
from ..loaders.binding.bind import prepared_targets
from ..loaders.dispatch import generation_steps as generation
from . import host


def denoise_in_engine(engine, model, positive, negative, latent, resolved, seed: int, strengths, *,
                      on_step: Optional[Callable] = None, on_latent: Optional[Callable] = None,
                      on_bind: Optional[Callable] = None, check_interrupt: Optional[Callable] = None) -> tuple:
    """(samples, bind report, batching dict) of one sampler run whose forwards go through ``engine``."""
    fuses, adapters = strengths.specs_at(resolved.start_step)
    binding = Binding.bound(fuses, adapters, exclusive=strengths.scheduled)
    for spec in binding.keys.values():
        prepared_targets(model.model, spec)  # read, mapped, accounted: the bind's own checks, before any batch
    context = host.current_context()  # the prompt and node this sampler runs for: the request's name on every rank
    key = (context.prompt_id, context.node_id) if context is not None else None
    interrupt = context.interrupt_event if context is not None else None
    with engine.denoising(model.model, binding, key=key, check_interrupt=check_interrupt, on_bind=on_bind,
                          interrupt=interrupt) as request:
        if strengths.scheduled:
            on_step = strengths.after_each_step(resolved.start_step, on_step, lambda step: request.rebind(
                Binding.bound(*strengths.specs_at(step), exclusive=True)))
        samples = generation.denoise(model.model, positive, negative, latent, resolved, seed, on_step=on_step,
                                     on_latent=on_latent, check_interrupt=check_interrupt)
    return samples, request.bind_report, request.batching.to_dict(engine.max_batch)
