"""The headless folder_paths registry (ComfyUI-compatible) and /object_info entries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lorabind.runtime import folder_paths
from lorabind.runtime.node_info import node_info, object_info
from runtime_fake_nodes import FAKE_NODES, RtAdd, RtRange, RtSaveText


@pytest.fixture
def models(tmp_path):
    root = tmp_path / "models"
    for folder in ("diffusers/tiny-wan", "diffusers/family/tiny-qwen"):
        (root / folder).mkdir(parents=True)
        (root / folder / "model_index.json").write_text("{}")
    (root / "diffusers/not-a-model").mkdir(parents=True)
    (root / "loras/sub").mkdir(parents=True)
    (root / "loras/a.safetensors").write_bytes(b"x")
    (root / "loras/sub/b.safetensors").write_bytes(b"x")
    (root / "loras/old.ckpt").write_bytes(b"x")
    (root / "loras/my-peft").mkdir()
    (root / "loras/my-peft/adapter_config.json").write_text("{}")
    (root / "loras/my-peft/adapter_model.safetensors").write_bytes(b"x")
    folder_paths.configure(models_root=str(root), output_dir=str(tmp_path / "out"), input_dir=str(tmp_path / "in"))
    yield root
    folder_paths.configure()


def test_lists_diffusers_folders_and_loras_with_peft_folders(models):
    assert folder_paths.models_dir == str(models)
    assert folder_paths.get_filename_list("diffusers") == ["family/tiny-qwen", "tiny-wan"]
    assert folder_paths.get_filename_list("loras") == ["a.safetensors", "my-peft", "sub/b.safetensors"]
    assert folder_paths.folder_names_and_paths["loras"][0] == [str(models / "loras")]
    assert folder_paths.get_full_path("loras", "sub/b.safetensors") == str(models / "loras/sub/b.safetensors")
    assert folder_paths.get_full_path("diffusers", "tiny-wan") == str(models / "diffusers/tiny-wan")
    assert folder_paths.get_full_path("loras", "missing.safetensors") is None


def test_missing_model_raises_comfyui_text(models):
    with pytest.raises(FileNotFoundError) as info:
        folder_paths.get_full_path_or_raise("loras", "missing.safetensors")
    assert str(info.value) == "Model in folder 'loras' with filename 'missing.safetensors' not found."


@pytest.mark.parametrize("name", ["../secret.safetensors", "sub/../../x.safetensors", "..\\x.safetensors"])
def test_dot_dot_names_are_refused(models, name):
    (models / "secret.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"'\.\.' would leave the 'loras' folder"):
        folder_paths.get_full_path("loras", name)


def test_absolute_names_are_refused(models):
    absolute = str(models / "loras" / "a.safetensors")
    with pytest.raises(ValueError, match="it is an absolute path"):
        folder_paths.get_full_path("loras", absolute)
    with pytest.raises(ValueError, match="absolute path"):
        folder_paths.get_full_path_or_raise("loras", "C:/models/a.safetensors")


def test_directories_and_save_path_counter(models, tmp_path):
    assert folder_paths.get_output_directory() == str(tmp_path / "out")
    assert folder_paths.get_input_directory() == str(tmp_path / "in")
    out = tmp_path / "out"
    folder, name, counter, subfolder, prefix = folder_paths.get_save_image_path("shots/run", str(out), 64, 32)
    assert (folder, name, counter, subfolder, prefix) == (str(out / "shots"), "run", 1, "shots", "shots/run")
    (out / "shots" / "run_00001_.png").write_bytes(b"")
    (out / "shots" / "run_00007_.png").write_bytes(b"")
    (out / "shots" / "runner_00050_.png").write_bytes(b"")
    assert folder_paths.get_save_image_path("shots/run", str(out))[2] == 8
    assert folder_paths.get_save_image_path("img_%width%x%height%", str(out), 64, 32)[1] == "img_64x32"
    with pytest.raises(ValueError, match="outside the output folder"):
        folder_paths.get_save_image_path("../escape", str(out))


def test_env_default_models_root(monkeypatch, tmp_path):
    monkeypatch.setenv("LORABIND_MODELS", str(tmp_path / "m"))
    folder_paths.configure()
    try:
        assert folder_paths.get_folder_paths("diffusers") == [str(tmp_path / "m" / "diffusers")]
    finally:
        monkeypatch.delenv("LORABIND_MODELS")
        folder_paths.configure()


def test_folder_paths_does_not_import_torch():
    code = "import sys, lorabind.runtime.folder_paths; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_node_info_has_the_v1_object_info_shape():
    info = node_info("RtAdd", RtAdd, "Add two ints")
    assert info == {
        "input": {"required": {"a": ["INT", {"forceInput": True}], "b": ["INT", {"default": 1}]}},
        "input_order": {"required": ["a", "b"]},
        "output": ["INT"], "output_is_list": [False], "output_name": ["sum"],
        "name": "RtAdd", "display_name": "Add two ints", "description": "", "python_module": "nodes",
        "category": "sd", "output_node": False,
    }
    assert json.loads(json.dumps(info)) == info
    assert node_info("RtRange", RtRange)["output_is_list"] == [True]
    assert node_info("RtSaveText", RtSaveText)["output_node"] is True


def test_object_info_skips_broken_nodes():
    class Broken:
        @classmethod
        def INPUT_TYPES(cls):
            raise RuntimeError("scan failed")

    info = object_info({**FAKE_NODES, "Broken": Broken}, {"RtInt": "Integer"})
    assert "Broken" not in info and set(info) == set(FAKE_NODES)
    assert info["RtInt"]["display_name"] == "Integer" and info["RtFloat"]["display_name"] == "RtFloat"
    assert info["RtHidden"]["input_order"] == {"required": ["value"],
                                               "hidden": ["unique_id", "prompt", "extra_pnginfo"]}
