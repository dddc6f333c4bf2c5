"""Where single files' keys start: the prefixes some files carry in front of every key (ComfyUI strips them too).

The key layouts themselves are ``io.key_layouts.KeyLayout`` objects each family declares for its own files
(``families/<family>/``: Wan's transformer, VAEs and umt5, Qwen-Image's transformer and Qwen2.5-VL, ...).
"""

from __future__ import annotations

# prefixes some single files carry in front of every key (ComfyUI strips them too)
DIFFUSION_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def strip_prefix(key: str) -> str:
    for prefix in DIFFUSION_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key
