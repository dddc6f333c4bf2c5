"""Single-file tests share the session's tiny models root, with the tiny single files written into it."""

import pytest


@pytest.fixture(scope="session")
def single_file_root(tiny_models_root):
    """The session's tiny models root plus the tiny single files under ``lorabind-tiny/`` in
    ``models/{diffusion_models,vae,text_encoders,clip_vision}/``."""
    from lorabind.tiny_models.single_files import write_tiny_single_files

    assert len(write_tiny_single_files(tiny_models_root)) == 47  # 32 safetensors + 6 GGUF + 9 VACE (3 x 3 precisions)
    return tiny_models_root
