"""Wan2.1 / Wan2.2: the family object (``FAMILY``) and the package's public functions.

Modules: ``keymap`` (LoRA names onto ``WanTransformer3DModel``), ``contracts`` (distill contracts, the Wan2.2
expert split), ``prediction`` (one forward of a Wan transformer), ``family`` (the ``ModelFamily``
implementation: loading, roles, text, latents, expert boundary).
"""

from .contracts import DISTILL_SHIFT, MOE_FAMILY, declared_contract  # noqa: F401
from .family import HIGH_NOISE_EXPERT, LOW_NOISE_EXPERT, WanFamily  # noqa: F401
from .keymap import IMAGE_BRANCH_REASON, expected_unmatched_reason, map_target, prepare, recognizes  # noqa: F401

FAMILY = WanFamily()
