"""Families that need newer libraries say which versions, instead of failing deep inside diffusers."""

import pytest

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.models import compat


def test_numeric_versions_compare_release_parts():
    assert compat._numeric("0.42.1") == (0, 42, 1)
    assert compat._numeric("5.0.0rc1") == (5, 0, 0)
    assert compat._numeric("2.13.0+cpu") == (2, 13, 0)
    assert compat._numeric("0.9.0") < compat._numeric("0.35")


def test_installed_libraries_meet_every_family(monkeypatch):
    from lorabind.loaders.families import all_families

    ids = [requirement for family in all_families() for requirement in family.layout.requirements]
    assert {"wan2.1", "wan2.2_moe", "wan2.2_ti2v", "qwen_image", "minimax_h3"} <= set(ids)
    for requirement in ids:
        assert compat.unmet_requirements(requirement) == []


def test_an_older_diffusers_is_named_with_the_version_needed(monkeypatch):
    monkeypatch.setattr(compat, "installed_version", lambda name: {"diffusers": "0.35.2"}.get(name, "9.0"))
    assert compat.unmet_requirements("minimax_h3") == ["diffusers >= 0.42 (installed 0.35.2)"]
    assert compat.unmet_requirements("wan2.2_moe") == []
    with pytest.raises(ModelLoadError, match=r"MiniMax-H3 needs diffusers >= 0\.42 \(installed 0\.35\.2\)"):
        compat.require("minimax_h3")


def test_a_missing_library_is_named(monkeypatch):
    monkeypatch.setattr(compat, "installed_version", lambda name: None if name == "transformers" else "9.0")
    with pytest.raises(ModelLoadError, match=r"Qwen-Image needs transformers >= 4\.49 \(installed none\)"):
        compat.require("qwen_image")


def test_a_ti2v_folder_or_file_is_checked_against_the_wan22_release(monkeypatch):
    """TI2V-5B is a one-transformer Wan pipeline (family "wan2.1") whose expand_timesteps came with diffusers 0.35."""
    from lorabind.loaders.families import family_by_id
    from lorabind.loaders.models.diffusers_folder import require_libraries

    monkeypatch.setattr(compat, "installed_version", lambda name: {"diffusers": "0.34.0"}.get(name, "9.0"))
    require_libraries({"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]},
                      "wan2.1", "wan21 (wan2.1)")  # a plain Wan2.1 folder is fine on 0.34
    ti2v_index = {"_class_name": "WanPipeline", "expand_timesteps": True}
    with pytest.raises(ModelLoadError, match=r"ti2v5b \(wan2\.1\) needs diffusers >= 0\.35 \(installed 0\.34\.0\)"):
        require_libraries(ti2v_index, "wan2.1", "ti2v5b (wan2.1)")
    wan = family_by_id("wan2.1")
    assert compat.unmet_requirements(wan.layout.requirements_id("wan2.1", variant="ti2v")) == [
        "diffusers >= 0.35 (installed 0.34.0)"]
    assert compat.unmet_requirements(wan.layout.requirements_id("wan2.1", variant="i2v")) == []


def test_an_edit_2511_folder_is_checked_against_the_release_that_knows_zero_cond_t(monkeypatch, tiny_models_root):
    """An older diffusers ignores ``zero_cond_t`` in the transformer config and would run 2511 as 2509: the folder
    is refused naming the version, while the 2509-style Edit folder loads on it."""
    from lorabind.loaders.io.model_index import read_model_index
    from lorabind.loaders.models.diffusers_folder import require_libraries

    monkeypatch.setattr(compat, "installed_version", lambda name: {"diffusers": "0.36.0"}.get(name, "9.0"))
    edit = tiny_models_root / "diffusers" / "tiny-qwen-image-edit"
    plus_2511 = tiny_models_root / "diffusers" / "tiny-qwen-image-edit-plus"
    require_libraries(read_model_index(edit), "qwen_image", "edit (qwen_image)", edit)
    with pytest.raises(ModelLoadError, match=r"plus \(qwen_image\) needs diffusers >= 0\.37 \(installed 0\.36\.0\)"):
        require_libraries(read_model_index(plus_2511), "qwen_image", "plus (qwen_image)", plus_2511)
