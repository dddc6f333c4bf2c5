"""Issue 59 item 4: ``--ulysses-degree 3`` on a model with 2 attention heads is refused by name before anything is
loaded (it failed after loading, at the first attention, with diffusers' bare ``AssertionError``), as ``tp`` is.
The rule is diffusers' own: Ulysses gives each rank whole heads; alone (its uneven mode) it pads the last rank's
heads while the padding is smaller than a rank's share, with ring too the degree must divide the heads."""

from __future__ import annotations

import pytest

from lorabind.loaders.distributed.spec import ParallelSpec, ulysses_heads_refusal
from lorabind.loaders.errors import ModelLoadError


@pytest.mark.parametrize("spec, heads, refused", [
    (ParallelSpec(ulysses=3), 2, True),  # pad 1, one head a rank: the padding is not smaller than the share
    (ParallelSpec(ulysses=2), 2, False),
    (ParallelSpec(ulysses=2), 3, False),  # pad 1 < 2 heads a rank: the uneven mode runs it
    (ParallelSpec(ulysses=8), 30, False),  # diffusers' own example of an allowed padding
    (ParallelSpec(ulysses=16), 30, True),  # and of a refused one
    (ParallelSpec(ulysses=2, ring=2), 3, True),  # with ring the degree must divide the heads
    (ParallelSpec(ulysses=2, ring=2), 4, False),
    (ParallelSpec(ring=4), 2, False),  # ring splits the sequence, not the heads
])
def test_the_rule_follows_diffusers(spec, heads, refused):
    assert (ulysses_heads_refusal(spec, heads, "m") is not None) is refused


def test_the_refusal_names_the_degree_the_heads_and_what_fits():
    assert ulysses_heads_refusal(ParallelSpec(ulysses=3), 2, "tiny-wan22-t2v 'transformer'") == (
        "--parallel ulysses=3: ulysses=3 cannot share the 2 attention heads of tiny-wan22-t2v 'transformer' (each "
        "rank runs whole heads); use a degree that divides 2 (2), or split it with ring= instead")


def test_a_two_head_model_under_ulysses_3_is_refused_before_a_weight_is_read(tiny_models_root, monkeypatch):
    from lorabind.loaders.distributed import process_group
    from lorabind.loaders.models import diffusers_folder
    from lorabind.loaders.models.store import load_model

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr(process_group._session, "spec", ParallelSpec(ulysses=3))
    monkeypatch.setattr(diffusers_folder.DiffusersFolder, "build", no_weights)
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(tiny_models_root / "diffusers" / "tiny-wan22-t2v"), name="tiny-wan22-t2v")
    assert str(caught.value).startswith("--parallel ulysses=3: ulysses=3 cannot share the 2 attention heads of "
                                        "tiny-wan22-t2v 'transformer'")
