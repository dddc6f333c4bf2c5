"""Shared helpers for the tiny-model builders: isolated seeding, atomic folder writes, and folders that read the
same under transformers 4.x and 5.x."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from ..loaders.io.safe_output import safe_output
from ..loaders.models.store import quiet_library_progress

log = logging.getLogger("lorabind.tiny_models")
WRITTEN_BY = "lorabind build-tiny"  # the safe_output marker of every built-in folder
BUILT_WITH_KEY = "_lorabind_built_with"  # model_index.json: the library versions a tiny model was built with
_LIBRARIES = ("torch", "diffusers", "transformers")
# transformers 5 saves a fast tokenizer as "TokenizersBackend", a class transformers 4.x does not have;
# "PreTrainedTokenizerFast" is that class in 4.x and an alias of it in 5.x, so both read the folder.
_PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


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


def save_pipeline_atomically(pipeline, folder: Path, finish=None) -> Path:
    """``save_pretrained`` by ``safe_output``'s rule: into a sibling temp folder swapped in at the end, so a reader
    never sees half a model, and only over an earlier built-in folder, never over a user's own folder that happens
    to carry a built-in's name. ``finish(staged folder)`` completes what ``save_pretrained`` cannot write."""
    with safe_output(str(folder), written_by=WRITTEN_BY, overwrite=True, label="built-in model folder") as staged:
        with quiet_library_progress():  # no "Writing model shards" bar in the middle of `lorabind run`
            pipeline.save_pretrained(staged, safe_serialization=True)
        if finish is not None:
            finish(Path(staged))
        finish_folder(Path(staged))
    return folder


def library_versions() -> dict:
    import importlib.metadata

    return {name: importlib.metadata.version(name) for name in _LIBRARIES}


def finish_folder(folder: Path) -> None:
    """Make a freshly saved tiny model portable and record what built it: tokenizer classes both transformers 4.x
    and 5.x know, and the library versions (random initialisation differs between versions, so a folder built
    under other versions would give other outputs; ``stale_reason`` finds those)."""
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text(encoding="utf-8"))
    for entry in index.values():
        if isinstance(entry, list) and entry == ["transformers", "TokenizersBackend"]:
            entry[1] = _PORTABLE_TOKENIZER_CLASS
    index[BUILT_WITH_KEY] = library_versions()
    index_file.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    for config_file in folder.glob("*/tokenizer_config.json"):
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if config.get("tokenizer_class") == "TokenizersBackend":
            config["tokenizer_class"] = _PORTABLE_TOKENIZER_CLASS
            config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def stale_reason(folder: Path) -> str | None:
    """Why a built tiny model must be rebuilt (built by other library versions), or None when it is current."""
    try:
        built = json.loads((folder / "model_index.json").read_text(encoding="utf-8")).get(BUILT_WITH_KEY)
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: loading it reports that with the file name
    installed = library_versions()
    if not isinstance(built, dict):
        return "it records no library versions (built by an older lorabind)"
    changed = [f"{name} {built.get(name)} -> {version}" for name, version in installed.items()
               if built.get(name) != version]
    return f"it was built with other library versions ({', '.join(changed)})" if changed else None
