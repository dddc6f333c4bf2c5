"""MiniMax-H3: the family object (``FAMILY``).

Modules: ``keymap`` (LoRA names, fused-layer rewrites), ``contracts`` (Turbo / native / checkpoint-pinned
contracts and their wording), ``resolve`` (a request against them: two schedules, a task, a partition),
``pipeline`` (load, encode, latents, first frame, decode), ``prediction`` (the packed sequence and one forward),
``references`` (ref2va reference images), ``sampling`` (the two-schedule Euler loop), ``family`` (its parts and
``FAMILY``).
"""

from .family import FAMILY  # noqa: F401
