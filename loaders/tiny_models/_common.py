"""Shared helpers for the tiny-model builders: isolated seeding and atomic folder writes."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from ..model_store import quiet_library_progress


@contextlib.contextmanager
def seeded(seed: int):
    """Seed torch's global CPU generator for a block without disturbing the caller's random state.

    Why: diffusers/transformers modules initialise their weights from the global generator; forking keeps the
    builders deterministic *and* leaves e.g. a test's own seeding untouched.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def diffusers_dir(models_root) -> Path:
    return Path(models_root) / "diffusers"


# The built-in fixture LoRAs live in their own folder under the loras root, never beside a user's files: they
# keep the real published basenames (the file-name contract grammar reads them), so outside this folder a
# random-weight fixture could pass for a missing download.
FIXTURE_LORA_FOLDER = "lorabind-tiny"


def fixture_lora_dir(models_root) -> Path:
    """``<models_root>/loras/lorabind-tiny``: where the fixture LoRAs are written."""
    return Path(models_root) / "loras" / FIXTURE_LORA_FOLDER


def save_pipeline_atomically(pipeline, folder: Path) -> Path:
    """``save_pretrained`` into a sibling temp folder, then swap it in, so a reader never sees half a model."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    staging.chmod(0o755)  # mkdtemp creates 0700; the model folder should read like any other
    try:
        with quiet_library_progress():  # no "Writing model shards" bar in the middle of `lorabind run`
            pipeline.save_pretrained(staging, safe_serialization=True)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder
