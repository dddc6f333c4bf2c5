"""Shared fixtures for the foundation tests: the built-in tiny models, built once per session, offline."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_models_root(tmp_path_factory):
    """A models root holding the three built-in tiny models (Wan2.2 MoE, Wan2.1, Qwen-Image)."""
    from lorabind.loaders.tiny_models import BUILTIN_MODELS, build_tiny

    root = tmp_path_factory.mktemp("foundation_models")
    build_tiny(root, names=list(BUILTIN_MODELS))
    return root


@pytest.fixture(scope="session")
def load_tiny(tiny_models_root):
    """``load_tiny(name)`` -> the shared LoadedModel of a built-in tiny model."""
    from lorabind.loaders.model_store import load_model

    return lambda name: load_model(tiny_models_root / "diffusers" / name, name=name)
