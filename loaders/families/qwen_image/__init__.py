"""Qwen-Image: the family object (``FAMILY``).

Modules: ``keymap`` (LoRA names onto ``QwenImageTransformer2DModel``), ``contracts`` (Lightning distill
contracts), ``prediction`` (packing, one forward, CFG renormalisation), ``edit`` (Qwen-Image-Edit's input
images), ``single_files`` (editions of equal shapes), ``family`` (its parts and ``FAMILY``).
"""

from .family import FAMILY  # noqa: F401
