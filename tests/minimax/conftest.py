"""Session fixtures for the MiniMax-H3 tests: both tiny models and the published-name fixture LoRAs, built once
into a temporary models root (offline, deterministic), and the runtime's folder registry pointed at it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def mm_root(tmp_path_factory):
    from lorabind.loaders.tiny_models.minimax_h3 import build_tiny_minimax_h3, write_minimax_fixture_loras

    root = tmp_path_factory.mktemp("minimax_models")
    build_tiny_minimax_h3(root)
    write_minimax_fixture_loras(root)
    return root


@pytest.fixture(scope="session")
def mm_models(mm_root):
    """{"plain": LoadedModel, "pinned": LoadedModel}, shared like the nodes get them."""
    from lorabind.loaders.model_store import load_model

    return {
        "plain": load_model(mm_root / "diffusers" / "tiny-minimax-h3"),
        "pinned": load_model(mm_root / "diffusers" / "tiny-minimax-h3-pinned"),
    }


@pytest.fixture
def mm_registry(mm_root, tmp_path):
    from lorabind.runtime import folder_paths

    folder_paths.configure(models_root=str(mm_root), output_dir=str(tmp_path / "output"),
                           input_dir=str(tmp_path / "input"))
    return folder_paths


@pytest.fixture
def fake_model():
    """A model stand-in for resolver tests: name, model_index, components (the partitions that exist)."""

    def make(model_index=None, partitions=("transformer", "transformer_ref"), name="tiny-minimax-h3"):
        model = SimpleNamespace(name=name, family="minimax_h3", model_index=model_index or {},
                                components={p: object() for p in partitions})
        return SimpleNamespace(model=model, family="minimax_h3", adapters=(), contracts=())

    return make
