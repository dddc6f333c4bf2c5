"""The one place the test session is set up: offline environment, shared helpers on the import path, the tiny
models built once per session, and a model registry that every test leaves as it found it.

Test folders mirror the package (``tests/loaders``, ``tests/nodes``, ``tests/runtime``); a folder's own
``conftest.py`` only adds fixtures that no other folder needs. There are no ``__init__.py`` files, so each test
module imports under its basename (basenames are unique) and shared helper modules live in ``tests/helpers/``,
which this file puts on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# No test may reach the network: the libraries read these before their first hub call.
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ[_name] = "1"

# `lorabind plan`'s sizes cache (loaders/placement/sizes_cache.py) goes to a folder of this session, not ~/.cache
os.environ.setdefault("LORABIND_CACHE_DIR", tempfile.mkdtemp(prefix="lorabind-test-cache-"))

HELPERS_DIR = Path(__file__).parent / "helpers"
if str(HELPERS_DIR) not in sys.path:
    sys.path.insert(0, str(HELPERS_DIR))


@pytest.fixture(scope="session")
def tiny_models_root(tmp_path_factory):
    """A models root with the Wan2.2 MoE, Wan2.1 and Qwen-Image tiny models and the Wan/Qwen fixture LoRAs."""
    from lorabind.tiny_models import BUILTIN_MODELS, build_tiny
    from lorabind.tiny_models.lora_fixtures import write_fixture_loras

    root = tmp_path_factory.mktemp("tiny_models")
    build_tiny(root, names=list(BUILTIN_MODELS))
    write_fixture_loras(root)
    return root


@pytest.fixture(scope="session")
def load_tiny(tiny_models_root):
    """``load_tiny(name)`` -> the shared LoadedModel of a built-in tiny model (the engine caches one per folder,
    exactly as the nodes get it)."""
    from lorabind.loaders.models.store import load_model

    return lambda name: load_model(str(tiny_models_root / "diffusers" / name), name=name)


@pytest.fixture(scope="session")
def tiny_sampler_inputs(load_tiny):
    """model name -> (ModelHandle, positive, negative, 32x32 5-frame latent) of the Wan2.2, Wan2.1 and Qwen-Image
    tiny models, encoded once for every sampler test."""
    from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text
    from lorabind.loaders.handles import ModelHandle

    out = {}
    for name in ("tiny-wan22-t2v", "tiny-wan21-t2v", "tiny-qwen-image"):
        model = load_tiny(name)
        out[name] = (ModelHandle(model), encode_text(model, "a cat"), encode_text(model, "blurry"),
                     empty_latent(model, 32, 32, 5))
    return out


@pytest.fixture(scope="session")
def mm_root(tmp_path_factory):
    """A models root with both tiny MiniMax-H3 models and the MiniMax-H3 fixture LoRAs."""
    from lorabind.tiny_models.minimax_h3 import build_tiny_minimax_h3, write_minimax_fixture_loras

    root = tmp_path_factory.mktemp("minimax_models")
    build_tiny_minimax_h3(root)
    write_minimax_fixture_loras(root)
    return root


class _MiniMaxModels:
    """``models["plain"]`` / ``models["pinned"]``: the shared LoadedModel, asked of the engine on every access
    (like ``load_tiny``), because a server test's "free memory" request empties the engine's model cache."""

    FOLDERS = {"plain": "tiny-minimax-h3", "pinned": "tiny-minimax-h3-pinned"}

    def __init__(self, root: Path):
        self.root = root

    def __getitem__(self, key: str):
        from lorabind.loaders.models.store import load_model

        return load_model(self.root / "diffusers" / self.FOLDERS[key])


@pytest.fixture(scope="session")
def mm_models(mm_root):
    """{"plain": LoadedModel, "pinned": LoadedModel}, shared like the nodes get them."""
    return _MiniMaxModels(mm_root)


@pytest.fixture(autouse=True)
def _no_step_engine_left():
    """A server built in a test installs the process's step engine; none outlives its test (a later test's
    sampler would route its forwards through it)."""
    yield
    from lorabind.loaders.batching import engine

    left = engine.installed()
    if left is not None:
        left.close()
        engine.install(None)


@pytest.fixture(autouse=True)
def _restore_registry():
    """Put the runtime's global folder registry back after every test, whoever configured it."""
    from lorabind.runtime import folder_paths

    saved = {name: getattr(folder_paths, name)
             for name in ("models_dir", "output_directory", "input_directory", "temp_directory")}
    saved_kinds = {kind: (list(dirs), set(exts)) for kind, (dirs, exts) in folder_paths.folder_names_and_paths.items()}
    yield
    for name, value in saved.items():
        setattr(folder_paths, name, value)
    folder_paths.folder_names_and_paths.clear()
    folder_paths.folder_names_and_paths.update(saved_kinds)


@pytest.fixture
def registry_at(tmp_path):
    """``registry_at(models_root)`` -> the runtime's folder_paths rooted there, with this test's own output and
    input folders (``tmp_path/output``, ``tmp_path/input``); restored after the test."""
    from lorabind.runtime import folder_paths

    def configure(models_root):
        folder_paths.configure(models_root=str(models_root), output_dir=str(tmp_path / "output"),
                               input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))
        return folder_paths

    return configure


@pytest.fixture
def registry(registry_at, tiny_models_root):
    """The runtime's folder_paths on the session's tiny models root (Wan/Qwen models and fixture LoRAs)."""
    return registry_at(tiny_models_root)


@pytest.fixture
def mm_registry(registry_at, mm_root):
    """The runtime's folder_paths on the session's MiniMax-H3 models root."""
    return registry_at(mm_root)
