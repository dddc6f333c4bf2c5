"""Families that need newer libraries say which versions, instead of failing deep inside diffusers."""

import pytest

from lorabind.loaders import compat
from lorabind.loaders.errors import ModelLoadError


def test_numeric_versions_compare_release_parts():
    assert compat._numeric("0.42.1") == (0, 42, 1)
    assert compat._numeric("5.0.0rc1") == (5, 0, 0)
    assert compat._numeric("2.13.0+cpu") == (2, 13, 0)
    assert compat._numeric("0.9.0") < compat._numeric("0.35")


def test_installed_libraries_meet_every_family(monkeypatch):
    for family in compat.REQUIREMENTS:
        assert compat.unmet_requirements(family) == []


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
