"""The server tests' own fixtures: a real server on an ephemeral loopback port with the fake test nodes, and a
models root holding everything ``lorabind models build-tiny`` writes (for the routes that read model files)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from server_client import start_server


@pytest.fixture
def server(tmp_path):
    srv = start_server(tmp_path)
    yield srv
    srv.stop()


def _link_entries(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if (target / entry.name).exists():  # a test that serves on the shared root may have built it there too
            continue
        (target / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())


@pytest.fixture(scope="session")
def build_tiny_root(tmp_path_factory, tiny_models_root, mm_root):
    """One models root holding everything ``lorabind models build-tiny`` writes: the Wan/Qwen and the MiniMax-H3
    models and fixture LoRAs (the session fixtures build them in two roots; linked or copied here, not rebuilt)."""
    root = tmp_path_factory.mktemp("build_tiny_root")
    for source in (Path(tiny_models_root), Path(mm_root)):
        _link_entries(source / "diffusers", root / "diffusers")
        # copied, not linked: a LoRA that links out of the loras folder is refused (docs/serving/comfyui-api.md,
        # "Safe defaults")
        shutil.copytree(source / "loras" / "lorabind-tiny", root / "loras" / "lorabind-tiny", dirs_exist_ok=True)
    return root
