"""Session fixtures for the adapter tests: the tiny Wan2.2 / Wan2.1 / Qwen-Image models and the LoRA fixtures
built once into a temporary models root (offline, deterministic), and the runtime's folder registry pointed at it.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ADAPTER_TEST_MODELS = ("tiny-wan22-t2v", "tiny-wan21-t2v", "tiny-qwen-image")


@pytest.fixture(scope="session")
def models_root(tmp_path_factory):
    from lorabind.loaders.tiny_models import build_tiny
    from lorabind.loaders.tiny_models.lora_fixtures import write_fixture_loras

    root = tmp_path_factory.mktemp("adapters_models")
    build_tiny(root, names=ADAPTER_TEST_MODELS)
    write_fixture_loras(root)
    return root


@pytest.fixture
def registry(models_root, tmp_path):
    """The runtime's folder_paths configured on the session models root with a per-test output folder."""
    from lorabind.runtime import folder_paths

    folder_paths.configure(models_root=str(models_root), output_dir=str(tmp_path / "output"),
                           input_dir=str(tmp_path / "input"))
    return folder_paths


@pytest.fixture(scope="session")
def loaded(models_root):
    """name -> shared LoadedModel (the engine caches one per folder, exactly as the nodes get it)."""
    from lorabind.loaders.model_store import load_model

    return {name: load_model(str(models_root / "diffusers" / name), name=name) for name in ADAPTER_TEST_MODELS}
