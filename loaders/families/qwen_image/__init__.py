"""Qwen-Image: the family object (``FAMILY``) and the package's public functions.

Modules: ``keymap`` (LoRA names onto ``QwenImageTransformer2DModel``), ``contracts`` (Lightning distill
contracts), ``prediction`` (packing, one forward, CFG renormalisation), ``family`` (the ``ModelFamily``
implementation).
"""

from .contracts import LIGHTNING_SHIFT, declared_contract  # noqa: F401
from .family import QwenImageFamily
from .keymap import map_target, recognizes  # noqa: F401
from .prediction import pack_qwen_latents, unpack_qwen_latents  # noqa: F401

FAMILY = QwenImageFamily()
