"""Model and LoRA listings are reused only while the folders they walked are unchanged (issue 33: the loader's
folder scan was a quarter of a seed-only rerun's validation).

A folder's modification time changes when an entry is added, removed or renamed, so each test ages the folders
(``os.utime`` into the past: a listing of folders modified within ``SETTLE_NS`` is never reused) and then
changes them as a user would; the listing must follow every change, and must not walk again when nothing
changed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lorabind.usecases import model_folders


def _age(*folders: Path) -> None:
    past = time.time() - 60
    for folder in folders:
        os.utime(folder, (past, past))


@pytest.fixture
def counted_walks(monkeypatch):
    walks = []
    original = model_folders.walk

    def counting(roots, walked=None):
        walks.append(tuple(roots))
        return original(roots, walked)

    monkeypatch.setattr(model_folders, "walk", counting)
    monkeypatch.setattr(model_folders, "_listings", {})
    return walks


def _model(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "model_index.json").write_text("{}")
    return root / name


def test_an_unchanged_model_folder_is_listed_without_walking_again(tmp_path, counted_walks):
    root = tmp_path / "diffusers"
    _age(_model(root, "a"), root)
    assert model_folders.model_folder_names([root]) == ["a"]
    assert model_folders.model_folder_names([root]) == ["a"]
    assert len(counted_walks) == 1


def test_a_model_added_or_deleted_between_listings_is_seen(tmp_path, counted_walks):
    root = tmp_path / "diffusers"
    _age(_model(root, "a"), root)
    assert model_folders.model_folder_names([root]) == ["a"]
    _model(root, "b")
    assert model_folders.model_folder_names([root]) == ["a", "b"]
    (root / "a" / "model_index.json").unlink()  # only the model's own folder changes
    assert model_folders.model_folder_names([root]) == ["b"]
    assert len(counted_walks) == 3


def test_a_missing_root_that_appears_is_seen(tmp_path, counted_walks):
    root = tmp_path / "diffusers"
    assert model_folders.model_folder_names([root]) == []
    _age(_model(root, "late"), root)
    assert model_folders.model_folder_names([root]) == ["late"]


def test_a_listing_of_just_modified_folders_is_walked_again(tmp_path, counted_walks):
    """Within the settle time a second change could keep the folder's mtime (coarse time stamps): never trusted."""
    root = tmp_path / "diffusers"
    _model(root, "a")
    model_folders.model_folder_names([root])
    model_folders.model_folder_names([root])
    assert len(counted_walks) == 2


def test_lora_and_gguf_lists_follow_a_deleted_file(tmp_path, counted_walks):
    loras = tmp_path / "loras"
    (loras / "sub").mkdir(parents=True)
    for name in ("one.safetensors", "sub/two.safetensors", "sub/three.gguf"):
        (loras / name).write_bytes(b"x")
    _age(loras, loras / "sub")
    assert model_folders.lora_names([str(loras)]) == ["one.safetensors", "sub/two.safetensors"]
    assert model_folders.files_named([str(loras)], ".gguf") == ["sub/three.gguf"]
    assert model_folders.lora_names([str(loras)]) == ["one.safetensors", "sub/two.safetensors"]
    assert len(counted_walks) == 2
    (loras / "sub" / "two.safetensors").unlink()
    (loras / "sub" / "three.gguf").unlink()
    assert model_folders.lora_names([str(loras)]) == ["one.safetensors"]
    assert model_folders.files_named([str(loras)], ".gguf") == []


def test_a_linked_folder_pointed_elsewhere_is_seen(tmp_path, counted_walks):
    """Models often live on another disk behind a link; repointing the link changes what is listed."""
    root, disk_a, disk_b = tmp_path / "diffusers", tmp_path / "disk_a", tmp_path / "disk_b"
    root.mkdir()
    _model(disk_a, "x")
    _model(disk_b, "y")
    (root / "shared").symlink_to(disk_a, target_is_directory=True)
    _age(root, disk_a, disk_b, disk_a / "x", disk_b / "y")
    assert model_folders.model_folder_names([root]) == ["shared/x"]
    (root / "shared").unlink()
    (root / "shared").symlink_to(disk_b, target_is_directory=True)
    assert model_folders.model_folder_names([root]) == ["shared/y"]


def test_a_persistent_executor_refuses_a_model_deleted_between_two_prompts(tmp_path, registry_at, counted_walks):
    """The loader's choice list is read for every prompt: the second validation names the missing model."""
    from lorabind.nodes.model_nodes import LoraBindModelLoader
    from lorabind.runtime.executor import PromptExecutor

    models = tmp_path / "models"
    root = models / "diffusers"
    _age(_model(root, "mine"), root)
    registry_at(models)
    executor = PromptExecutor({"LoraBindModelLoader": LoraBindModelLoader, "Out": _Out})
    prompt = {"1": {"class_type": "LoraBindModelLoader", "inputs": {"model_name": "mine", "dtype": "auto"}},
              "2": {"class_type": "Out", "inputs": {"model": ["1", 0]}}}
    assert executor.validate(prompt).ok
    assert executor.validate(prompt).ok
    for path in sorted((root / "mine").rglob("*"), reverse=True):
        path.unlink()
    (root / "mine").rmdir()
    refused = executor.validate(prompt)
    assert not refused.ok
    error = refused.node_errors["1"]["errors"][0]
    assert error["type"] == "value_not_in_list" and "'mine' not found" in error["details"]


class _Out:
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    FUNCTION = "show"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("LORABIND_MODEL",)}}

    def show(self, model):
        return {}


def test_the_loader_is_changed_follows_a_rebuilt_replaced_rewritten_or_deleted_model(tmp_path, registry_at):
    """``model_version``: a rebuilt model_index.json, a component file rewritten in place with its size and mtime
    (issue 61: a rewritten VAE changed the next output silently) or replaced each change the value; a deleted one
    says missing, and a name leaving the roots is never looked up."""
    from lorabind.nodes.model_nodes import LoraBindModelLoader

    models = tmp_path / "models"
    folder = _model(models / "diffusers", "mine")
    (folder / "vae").mkdir()
    weights = folder / "vae" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(b"a" * 64)
    registry_at(models)
    seen = [LoraBindModelLoader.IS_CHANGED("mine", "auto")]
    assert seen[0].startswith("mine:") and seen[0].endswith(":auto") and str(tmp_path) not in seen[0]
    assert LoraBindModelLoader.IS_CHANGED("mine", "auto") == seen[0]  # nothing changed: the same value
    (folder / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    seen.append(LoraBindModelLoader.IS_CHANGED("mine", "auto"))
    before = os.stat(weights)
    with open(weights, "r+b") as handle:  # in place: same inode and size, the mtime set back
        handle.write(b"b")
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    seen.append(LoraBindModelLoader.IS_CHANGED("mine", "auto"))
    weights.with_suffix(".new").write_bytes(b"c" * 64)
    os.replace(weights.with_suffix(".new"), weights)  # replaced, as a download does
    seen.append(LoraBindModelLoader.IS_CHANGED("mine", "auto"))
    assert len(set(seen)) == 4, seen
    (folder / "model_index.json").unlink()
    assert LoraBindModelLoader.IS_CHANGED("mine", "auto") == "mine:missing:auto"
    (folder / "model_index.json").mkdir()  # not a file: not a model
    assert LoraBindModelLoader.IS_CHANGED("mine", "auto") == "mine:missing:auto"
    assert LoraBindModelLoader.IS_CHANGED("../outside", "auto") == "../outside:missing:auto"


@pytest.mark.parametrize("name", ["../outside", "a/../../b", "/etc", "C:/models/x", "C:x", ".", "./", "", "  "])
def test_a_model_name_that_names_no_folder_under_the_roots_is_refused_by_name(tmp_path, registry_at, name):
    from lorabind.usecases.models import find_model

    models = tmp_path / "models"
    _model(models / "diffusers", "mine")
    with pytest.raises(ValueError) as refused:
        find_model(registry_at(models), name)
    message = str(refused.value)
    assert message == f"model_name {name!r}: must be a folder name under models/diffusers"  # names the input
    assert str(tmp_path) not in message  # the message reaches the browser: no local paths


def test_a_model_name_is_found_with_either_slash_and_parsed_once(tmp_path, registry_at):
    from lorabind.usecases.models import _confined_parts, find_model

    models = tmp_path / "models"
    folder = _model(models / "diffusers" / "wan", "mine")
    registry = registry_at(models)
    assert find_model(registry, "wan/mine") == folder and find_model(registry, "wan\\mine") == folder
    before = _confined_parts.cache_info().hits
    assert find_model(registry, "wan/mine") == folder and _confined_parts.cache_info().hits == before + 1
