"""bench/measure.py and bench/history.py: the balanced alternation used where both sides may run the same code, and
``--compare``'s noise rule (issue 33)."""

import json
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


def test_compare_flags_only_what_moved_the_wrong_way_by_more_than_its_noise(tmp_path):
    from lorabind.bench.history import METRICS, compare

    previous = tmp_path / "before.json"
    previous.write_text(json.dumps({"figures": {"switch_speedup_vs_diffusers": 5.0, "fuse_vs_floor": 1.0,
                                                "peak_mem_ratio": 1.0}}))
    switch_noise, floor_noise = METRICS["switch_speedup_vs_diffusers"][1], METRICS["fuse_vs_floor"][1]
    lines = compare({"switch_speedup_vs_diffusers": 5.0 * (1 - switch_noise - 0.05),  # slower: beyond the noise
                     "fuse_vs_floor": 1.0 + floor_noise / 2,  # worse, within the noise
                     "peak_mem_ratio": 0.5}, str(previous))  # better by far: never flagged
    flagged = {line.split(":", 1)[0] for line in lines if "WORSE" in line}
    assert flagged == {"switch_speedup_vs_diffusers"} and len(lines) == 3
