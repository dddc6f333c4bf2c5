"""LoRA files in, canonical patches out.

``read_lora`` reads a ``.safetensors`` file or PEFT folder (every real-world key layout) into a ``LoraFile``;
``map_to_model`` maps it onto one model family's diffusers module paths; ``account`` checks the result against
the real module tree and counts every tensor as applied, expected-unmatched or unmatched.
"""

from .accounting import KeyAccounting, account
from .canonical import LoraFile, LowRankDelta, MappedLora, TargetPatch
from .mapping import map_to_model
from .reader import clear_lora_cache, read_lora

__all__ = ["KeyAccounting", "LoraFile", "LowRankDelta", "MappedLora", "TargetPatch", "account",
           "clear_lora_cache", "map_to_model", "read_lora"]
