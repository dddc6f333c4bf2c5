"""Tiny MiniMax-H3 models (placeholder until its owner fills it in)."""


def build_tiny_minimax_h3(models_root):
    """Build the tiny MiniMax-H3 model folders under ``models_root/diffusers``; return the folders written."""
    return []
