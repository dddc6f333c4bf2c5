"""A loader's ``model_name`` that is a repository id (issue 55): ``LoraBindModelLoader`` with
``Wan-AI/Wan2.2-T2V-A14B-Diffusers`` runs the model's published single files once ``lorabind models download``
put them in the model folders; before that, ``run`` names the command. The files come from a fake hub on loopback
serving tiny files under the real names (``fake_hub``, ``published_tiny``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lorabind
from fake_hub import FakeHub
from lorabind.runtime import cli, folder_paths
from lorabind.runtime.cli import main
from published_tiny import published_hub_files

REPO = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
TEMPLATE = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_tiny_t2v.api.json"


def _main(*argv) -> int:
    try:
        return main(list(argv))
    finally:
        folder_paths.configure()


@pytest.fixture
def workflow(tmp_path) -> Path:
    """The tiny T2V template with its loader naming the repository instead of the tiny model."""
    prompt = json.loads(TEMPLATE.read_text())
    (loader,) = [node for node in prompt.values() if node["class_type"] == "LoraBindModelLoader"]
    loader["inputs"]["model_name"] = REPO
    path = tmp_path / "repository_model.api.json"
    path.write_text(json.dumps(prompt))
    return path


@pytest.mark.slow  # runs the workflow on the tiny stand-ins
def test_a_loader_names_a_repository_and_runs_once_its_files_are_downloaded(tiny_models_root, workflow, tmp_path,
                                                                              capsys, monkeypatch):
    models, output = tmp_path / "models", tmp_path / "output"
    assert _main("run", str(workflow), "--models", str(models), "--output", str(output)) == 1
    err = capsys.readouterr().err
    assert (f"input 'model_name': Value not in list: '{REPO}'" in err
            and f"get them with `lorabind models download {REPO} --weights fp8`" in err)
    assert "lorabind run: 1 model file(s) missing" in err and "get them with: lorabind models download" in err

    with FakeHub(published_hub_files(tiny_models_root)) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(cli, "_USERS_HUB_OFFLINE", [False])
        assert _main("models", "download", REPO, "--weights", "fp8", "--models", str(models)) == 0
    capsys.readouterr()
    assert _main("models", "check", str(workflow), "--models", str(models)) == 0
    assert (f"found    node 1 model_name: diffusers/{REPO} — published single files: "
            "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors, wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors, "
            "umt5_xxl_fp16.safetensors, wan_2.1_vae.safetensors") in capsys.readouterr().out

    assert _main("run", str(workflow), "--models", str(models), "--output", str(output)) == 0
    assert list((output / "lorabind").glob("wan22_tiny_t2v_*.webp"))


def test_a_repository_id_is_one_of_the_loaders_choices_only_when_its_files_are_there(tiny_models_root, tmp_path):
    from lorabind.usecases.models import list_models

    folder_paths.configure(models_root=str(tmp_path))
    try:
        assert REPO not in list_models(folder_paths)
        for destination, stand_in in (("diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "a"),
                                      ("diffusion_models/Wan2.2-T2V-A14B-LowNoise-Q4_K_M.gguf", "b"),
                                      ("text_encoders/umt5_xxl_fp16.safetensors", "c")):
            (tmp_path / destination).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / destination).write_text(stand_in)
        assert REPO not in list_models(folder_paths)  # no VAE yet
        (tmp_path / "vae").mkdir()
        (tmp_path / "vae" / "wan_2.1_vae.safetensors").write_text("d")
        assert REPO in list_models(folder_paths)  # each component from whichever storage is there
    finally:
        folder_paths.configure()
