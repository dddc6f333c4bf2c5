"""Building and loading the tiny MiniMax-H3 model prints nothing of the libraries' own: no "Writing model
shards" bar, no torch FutureWarning about ``weight_norm`` (diffusers' audio VAE uses the deprecated API)."""

from __future__ import annotations

import warnings

import pytest

from lorabind.loaders.models import compat


@pytest.mark.slow
@pytest.mark.skipif(bool(compat.unmet_requirements("minimax_h3")), reason="MiniMax-H3 needs a newer diffusers")
def test_building_and_loading_minimax_h3_is_quiet(tmp_path, capfd):
    from lorabind.loaders.models.store import load_model
    from lorabind.tiny_models import build_tiny

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_tiny(tmp_path, names=["tiny-minimax-h3"])
        model = load_model(str(tmp_path / "diffusers" / "tiny-minimax-h3"))
    assert model.family == "minimax_h3"
    assert [str(w.message) for w in caught if "weight_norm" in str(w.message)] == []
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "Loading" not in err and "\r" not in err
