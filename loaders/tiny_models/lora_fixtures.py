"""Synthetic LoRA fixtures with real published names (placeholder until its owner fills it in)."""


def write_fixture_loras(models_root):
    """Write small synthetic LoRA files into ``models_root/loras``; return the files written."""
    return []
