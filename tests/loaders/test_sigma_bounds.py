"""Issue 46 item 11: a sigma list is bounded at one point more than the most steps a sampler runs, and messages
quote a few values (a 10^6-point SIGMAS input with one NaN made a 14 MB message)."""

from __future__ import annotations

import pytest

from lorabind.loaders.contract_types import MAX_STEPS
from lorabind.loaders.contracts.sigmas import MAX_POINTS, check_run_sigmas, validate_schedule


def _descending(count: int) -> list:
    return [1.0 - i / (count - 1) for i in range(count)]


@pytest.mark.parametrize("check", [check_run_sigmas, validate_schedule])
def test_sigmas_at_the_bound_pass_and_one_past_is_refused(check):
    assert MAX_POINTS == MAX_STEPS + 1
    assert len(check(_descending(MAX_POINTS), "sigmas input")) == MAX_POINTS
    with pytest.raises(ValueError, match=rf"^sigmas input: {MAX_POINTS + 1} sigma points, over the {MAX_POINTS}"):
        check(_descending(MAX_POINTS + 1), "sigmas input")


def test_a_huge_list_with_a_nan_gets_a_short_message():
    torch = pytest.importorskip("torch")
    huge = torch.linspace(1, 0, 1_000_000)
    huge[500] = float("nan")
    with pytest.raises(ValueError) as caught:
        check_run_sigmas(huge, "sigmas input")
    assert "1000000 sigma points" in str(caught.value) and len(str(caught.value)) < 200


def test_messages_quote_a_few_values():
    points = _descending(MAX_POINTS)
    points[700] = float("nan")
    with pytest.raises(ValueError) as caught:
        check_run_sigmas(points, "sigmas input")
    message = str(caught.value)
    assert message.startswith("sigmas input: sigma point 700 is nan, a non-finite value ([1, 0.999, 0.998, ...")
    assert message.endswith("(1001 points))") and len(message) < 200
    rising = _descending(50)[::-1]
    with pytest.raises(ValueError, match=r"must start at 1.0 and end at 0.0") as caught:
        validate_schedule(rising, "a.safetensors")
    assert len(str(caught.value)) < 200
