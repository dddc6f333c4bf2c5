"""bench/measure.py and bench/history.py: the balanced alternation used where both sides may run the same code, and
``--compare``'s noise rule (issue 33)."""

import json
import pathlib
import sys

import pytest

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


def test_a_figure_whose_sides_ran_the_same_code_is_met_by_construction_and_only_then():
    from lorabind.bench.history import BY_CONSTRUCTION, _goal_text, judged, verdict

    assert judged("parallel_load_speedup", 0.96) == (">=", 1.0, "missed")
    assert judged("parallel_load_speedup", 1.2) == (">=", 1.0, "met")
    same = {"parallel_load_same_path": True}
    assert judged("parallel_load_speedup", 0.96, same) == (">=", 1.0, BY_CONSTRUCTION)
    assert verdict("parallel_load_speedup", 0.96, same) == "target >= 1: met by construction"
    assert "noise of identical runs" in _goal_text("parallel_load_speedup", 0.96, same)
    assert judged("rerun_runtime_overhead", 1.06, same) == ("<=", 1.05, "missed")  # only the figure that says so
    assert verdict("rerun_runtime_overhead", 1.06) == "target <= 1.05: MISSED"


def test_the_docs_table_is_rewritten_between_its_markers_on_the_performance_page(tmp_path):
    from lorabind.bench.history import _TABLE_END, _TABLE_START, PERFORMANCE_PAGE, write_table

    assert PERFORMANCE_PAGE == ROOT / "docs" / "performance" / "benchmarks.md"
    assert _TABLE_START in PERFORMANCE_PAGE.read_text() and _TABLE_END in PERFORMANCE_PAGE.read_text()
    run = tmp_path / "2026-12-02-abc1234.json"
    run.write_text(json.dumps({"commit": "abc1234", "date": "2026-12-02T00:00:00+00:00", "load_average": [0.5],
                               "figures": {"fuse_vs_floor": 1.16}}))
    page = tmp_path / "benchmarks.md"
    page.write_text(f"before\n{_TABLE_START}\nold table\n{_TABLE_END}\nafter\n")
    write_table(run, page)
    text = page.read_text()
    assert text.startswith(f"before\n{_TABLE_START}\n") and text.endswith(f"{_TABLE_END}\nafter\n")
    assert "old table" not in text and "| **1.16** | ≤ 1.3: met |" in text


def test_the_readme_shows_the_headline_figures_of_the_same_run(tmp_path):
    from lorabind.bench.history import _HEADLINE_END, _HEADLINE_START, HEADLINE, METRICS, README, write_headline

    assert README == ROOT / "README.md"
    assert _HEADLINE_START in README.read_text() and _HEADLINE_END in README.read_text()
    assert set(HEADLINE) <= set(METRICS)
    run = tmp_path / "2026-12-02-abc1234.json"
    run.write_text(json.dumps({"commit": "abc1234", "date": "2026-12-02T00:00:00+00:00", "load_average": [0.5],
                               "figures": {"fuse_vs_floor": 1.16, HEADLINE[0]: 4.5, HEADLINE[-1]: 9.5}}))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{_HEADLINE_START}\n{_HEADLINE_END}\nrest\n")
    write_headline(run, readme)
    rows = [line for line in readme.read_text().splitlines() if line.startswith("| ") and "`" in line]
    assert [row.split("`")[1] for row in rows] == [HEADLINE[0], HEADLINE[-1]]  # only headline figures, in order
    assert "| **4.50** |" in rows[0] and readme.read_text().endswith(f"{_HEADLINE_END}\nrest\n")


def test_a_page_without_the_markers_is_refused_not_overwritten(tmp_path):
    from lorabind.bench.history import write_table

    page = tmp_path / "benchmarks.md"
    page.write_text("no table here\n")
    with pytest.raises(SystemExit, match="has no generated bench table"):
        write_table(tmp_path / "unused.json", page)
    assert page.read_text() == "no table here\n"
