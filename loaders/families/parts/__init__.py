"""The parts a ``ModelFamily`` is composed of, each a small base class holding the defaults most families share.

Why parts: one family interface that answered every question (roles, key names, contracts, sampling) had grown
to 48 members; a caller that only maps LoRA names saw all of them. Each part answers one kind of question:
``layout`` what is known before loading, ``keymap`` the LoRA key names, ``contracts`` the sampling contracts,
``sampling`` loading, encoding, latents, the denoise loop and decoding. A family package supplies its own
subclass of each, next to the code it calls.
"""

from .contracts import FamilyContracts
from .keymap import KeyMap
from .layout import FamilyLayout
from .sampling import FamilySampling

__all__ = ["FamilyContracts", "FamilyLayout", "FamilySampling", "KeyMap"]
