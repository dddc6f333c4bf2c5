"""Session fixtures for the patching / binding / adapter tests (tiny models built once, offline)."""

from __future__ import annotations

import pytest

from patching_helpers import build_tiny_wan_transformer


@pytest.fixture(scope="session")
def tiny_wan_state():
    """State dict of the tiny transformer (fp32); tests load it into fresh modules."""
    return {k: v.clone() for k, v in build_tiny_wan_transformer(0).state_dict().items()}


@pytest.fixture
def make_transformer(tiny_wan_state):
    """Factory: a fresh tiny Wan transformer with the session's weights, in the requested dtype."""

    def make(dtype=None):
        model = build_tiny_wan_transformer(0)
        model.load_state_dict(tiny_wan_state)
        return model.to(dtype) if dtype is not None else model

    return make


@pytest.fixture
def make_model(make_transformer):
    """Factory: a fresh two-expert LoadedModel (family wan2.2_moe) around tiny transformers."""
    from lorabind.loaders.models.store import LoadedModel

    def make(dtype=None):
        return LoadedModel(path="/tmp/tiny-wan22-t2v", name="tiny-wan22-t2v", family="wan2.2_moe", pipeline=None,
                           components={"transformer": make_transformer(dtype), "transformer_2": make_transformer(dtype)})

    return make
