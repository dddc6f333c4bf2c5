"""Wan2.1 / Wan2.2: the family object (``FAMILY``).

Modules: ``layout`` (roles, expert slots, requirements, tiny models), ``keymap`` (LoRA names onto
``WanTransformer3DModel``), ``contracts`` (distill contracts, the Wan2.2 expert split), ``prediction`` (one
forward of a Wan transformer), ``family`` (the contracts and sampling parts, and ``FAMILY``), ``quiet_fallback``
(the one transformers warning Wan's I2V pipeline import would print, dropped before anything imports it).
"""

from . import quiet_fallback
from .family import FAMILY  # noqa: F401

quiet_fallback.install()
