"""The step engine's parts on their own: stacking by a family's batch rule, the batch choice and its bound on
how long a forward is passed over, and the device turn (first come, first served; given up while waiting)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from lorabind.loaders.batching import grouping, stacking
from lorabind.loaders.batching.device_turn import DeviceTurn
from lorabind.loaders.generation.batch_rules import BatchRule

RULE = BatchRule(rows=frozenset({"hidden_states", "timestep", "text", "mask"}), lists=frozenset({"shapes"}),
                 shared=frozenset({"return_dict", "scale"}), padded={"text": "mask"})


def _call(rows: int, text_length: int, mask=True, **extra) -> dict:
    inputs = {"hidden_states": torch.randn(rows, 4, 3), "timestep": torch.rand(rows),
              "text": torch.randn(rows, text_length, 2), "shapes": [(1, 2, 2)] * rows, "return_dict": False,
              "scale": torch.ones(2)}
    if mask:
        inputs["mask"] = torch.ones(rows, text_length, dtype=torch.bool)
    return {**inputs, **extra}


def test_text_of_other_lengths_is_padded_and_masked():
    calls = [_call(1, 3), _call(2, 5)]
    assert stacking.signature(RULE, calls[0]) == stacking.signature(RULE, calls[1])
    stacked, counts = stacking.stack(RULE, calls)
    assert counts == [1, 2]
    assert stacked["text"].shape == (3, 5, 2) and stacked["hidden_states"].shape == (3, 4, 3)
    assert stacked["mask"].tolist()[0] == [True, True, True, False, False]
    assert torch.equal(stacked["text"][0, 3:], torch.zeros(2, 2))
    assert torch.equal(stacked["text"][1:], calls[1]["text"])
    assert stacked["shapes"] == [(1, 2, 2)] * 3 and stacked["return_dict"] is False
    first, second = stacking.split((stacked["hidden_states"], "kept"), counts)
    assert torch.equal(first[0], calls[0]["hidden_states"]) and second[1] == "kept"


def test_what_a_rule_does_not_cover_does_not_stack():
    assert stacking.signature(RULE, _call(1, 3, unknown=torch.ones(1))) is None
    no_mask = BatchRule(rows=RULE.rows - {"mask"}, lists=RULE.lists, shared=RULE.shared, padded={"text": "mask"})
    assert stacking.signature(no_mask, _call(1, 3, mask=False)) != stacking.signature(no_mask, _call(1, 5, mask=False))
    other_scale = _call(1, 3, scale=torch.zeros(2))
    assert not stacking.same_shared(RULE, _call(1, 3), other_scale)


def _pending(number: int, group="g", component="transformer", passed_over=0, model="m"):
    request = SimpleNamespace(model=model, group=group)
    return SimpleNamespace(request=request, component=component, signature=("s",), rule=RULE, passed_over=passed_over,
                           number=number, inputs={"scale": torch.ones(2)})


def test_the_batch_choice_prefers_no_rebind_then_the_same_expert_then_size():
    bound = {"g"}
    calls = [_pending(1, group="h"), _pending(2), _pending(3), _pending(4, component="transformer_2")]
    batch = grouping.choose_batch(calls, 4, 8, "transformer", lambda c: c.request.group not in bound)
    assert [c.number for c in batch] == [2, 3]
    batch = grouping.choose_batch(calls, 4, 8, "transformer_2", lambda c: c.request.group not in bound)
    assert [c.number for c in batch] == [4]
    assert [c.number for c in grouping.choose_batch(calls, 1, 8, "transformer", lambda c: False)] == [1]


def test_a_forward_passed_over_limit_times_goes_next_whatever_it_costs():
    calls = [_pending(1, group="h", passed_over=8), _pending(2), _pending(3)]
    batch = grouping.choose_batch(calls, 4, 8, "transformer", lambda c: c.request.group == "h")
    assert [c.number for c in batch] == [1]


def test_the_device_turn_is_first_come_first_served_and_given_up_while_waiting():
    turn, order = DeviceTurn(), []
    entered = threading.Event()

    def holder():
        with turn.held():
            with turn.held():  # nested: one turn
                entered.set()
                with turn.given_up():  # e.g. a sampler waiting for the engine
                    time.sleep(0.3)
                order.append("holder back")

    def other(name, delay):
        time.sleep(delay)
        with turn.held():
            order.append(name)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert entered.wait(10)
    threads += [threading.Thread(target=other, args=(name, delay)) for name, delay in (("a", 0.0), ("b", 0.1))]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == ["a", "b", "holder back"]


@pytest.mark.parametrize("max_batch", [0, -1])
def test_an_engine_batches_at_least_one(max_batch):
    from lorabind.loaders.batching.engine import StepEngine

    with pytest.raises(ValueError, match="max_batch is 1 or more"):
        StepEngine(max_batch=max_batch)
