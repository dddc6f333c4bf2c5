"""Built-ins and model folders whose family needs newer libraries say which versions, and touch nothing."""

import shutil

import pytest

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.models import compat
from lorabind.loaders.models.store import load_model
from lorabind.tiny_models import build_builtin, unavailable_builtins


@pytest.fixture
def diffusers_0_35(monkeypatch):
    monkeypatch.setattr(compat, "installed_version", lambda name: {"diffusers": "0.35.2"}.get(name, "9.0"))


def test_unavailable_builtins_name_the_version_they_need(diffusers_0_35):
    needs = "needs diffusers >= 0.42 (installed 0.35.2)"
    vace = "needs diffusers >= 0.36 (installed 0.35.2)"
    assert unavailable_builtins() == {"tiny-minimax-h3": needs, "tiny-minimax-h3-pinned": needs,
                                      "tiny-wan21-vace": vace, "tiny-wan22-vace-fun": vace,
                                      # Edit-2511's config (zero_cond_t) came after 0.36
                                      "tiny-qwen-image-edit-plus": "needs diffusers >= 0.37 (installed 0.35.2)"}


def test_building_an_unavailable_builtin_is_refused_before_any_folder_is_made(diffusers_0_35, tmp_path):
    with pytest.raises(ModelLoadError, match=r"the built-in tiny-minimax-h3 needs diffusers >= 0\.42"):
        build_builtin("tiny-minimax-h3", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_loading_a_folder_of_a_newer_family_names_the_version(tiny_models_root, tmp_path, monkeypatch):
    folder = shutil.copytree(tiny_models_root / "diffusers" / "tiny-qwen-image", tmp_path / "my-qwen")
    monkeypatch.setattr(compat, "installed_version", lambda name: {"transformers": "4.46.3"}.get(name, "9.0"))
    with pytest.raises(ModelLoadError, match=r"my-qwen \(qwen_image\) needs transformers >= 4\.49 \(installed 4\.46\.3\)"):
        load_model(folder)


def test_build_tiny_writes_the_minimax_fixture_loras_even_where_the_models_cannot_be_built(
        diffusers_0_35, tmp_path, monkeypatch):
    """Listed fixtures let a MiniMax-H3 example pass validation inside ComfyUI, so that its model loader refuses it
    with the version message (ComfyUI would otherwise answer "Value not in list" for the LoRA)."""
    from lorabind import tiny_models
    from lorabind.tiny_models import minimax_h3

    built = []  # the model builds are recorded, not run: only the MiniMax-H3 part of the build matters here
    monkeypatch.setattr(tiny_models, "_build_recipes", lambda names, root, force=False: built.extend(names) or [])
    monkeypatch.setattr(tiny_models.single_files, "write_tiny_single_files", lambda root: [])
    tiny_models.build_tiny(tmp_path)
    assert built and not [name for name in built if name.startswith("tiny-minimax-h3")]
    assert sorted(n for n in minimax_h3.FIXTURE_NAMES if (tmp_path / "loras" / n).is_file()) == sorted(
        minimax_h3.FIXTURE_NAMES)
