"""bench/measure.py: the balanced alternation used where both sides may run the same code (issue 33)."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_alternate_balanced_reverses_every_other_pair():
    sys.path.insert(0, str(ROOT))
    try:
        from bench.measure import alternate_balanced
    finally:
        sys.path.remove(str(ROOT))
    order = []

    def side(name, seconds):
        def run():
            order.append(name)
            return seconds
        return run

    pair = alternate_balanced("a", side("a", 2.0), "b", side("b", 1.0), reps=4, warmup=1)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then AB BA AB BA
    assert pair.times_a == [2.0] * 4 and pair.times_b == [1.0] * 4 and pair.ratio == 2.0
