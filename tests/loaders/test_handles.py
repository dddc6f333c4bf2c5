"""Handles are cheap immutable descriptions: new handles per node, identity equality, short reprs."""

from types import SimpleNamespace

import torch

from lorabind.loaders.handles import AdapterHandle, AdapterSpec, FuseSpec, LatentHandle, ModelHandle


def _model():
    return SimpleNamespace(name="tiny-wan22-t2v", family="wan2.2_moe")


def test_with_fuses_returns_a_new_handle_and_leaves_the_original_alone():
    base = ModelHandle(_model())
    fused = base.with_fuses(FuseSpec("/loras/a.safetensors", 0.5, "transformer", "a.safetensors"))
    assert base.fuses == ()
    assert [f.strength for f in fused.fuses] == [0.5]
    assert fused.model is base.model


def test_handles_compare_by_identity_not_value():
    model = _model()
    assert ModelHandle(model) != ModelHandle(model)
    assert len({ModelHandle(model), ModelHandle(model)}) == 2


def test_reprs_are_short_and_name_what_matters():
    handle = ModelHandle(_model()).with_fuses(FuseSpec("/l/high.safetensors", 1.0, "transformer", "high.safetensors"))
    text = repr(handle)
    assert text == "ModelHandle('tiny-wan22-t2v', wan2.2_moe, fuses=[high.safetensors@1->transformer], adapters=[])"
    latent = LatentHandle(torch.zeros(1, 16, 2, 4, 4), "wan2.2_moe")
    assert repr(latent) == "LatentHandle(wan2.2_moe, video, shape=[1, 16, 2, 4, 4])"
    stacked = AdapterHandle().stacked(AdapterSpec("/l/p", 0.25, name="peft"))
    assert repr(stacked) == "AdapterHandle([peft@0.25])"
