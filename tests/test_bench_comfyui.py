"""bench/bench_comfyui.py without ComfyUI: its arguments, its workflows, its table and where the table goes (issue 43).

The real run (ComfyUI 0.30.0 through the harness, minutes at the bench's width) is not part of the suite."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT))
    try:
        from bench import bench_comfyui, comfyui_workload
    finally:
        sys.path.remove(str(ROOT))
    return bench_comfyui, comfyui_workload


def _records(seconds: dict) -> list:
    """Two repetitions per cell: ``seconds[(path, stage)]`` and three times it, so the median is twice it."""
    return [{"rep": rep, "path": path, "stage": stage, "first_step_s": value * (1 + 2 * rep), "total_s": 9.0}
            for (path, stage), value in seconds.items() for rep in (0, 1)]


def _changed_inputs(before: dict, after: dict) -> set:
    return {str(after[node]["inputs"][name]) for node in after for name in after[node]["inputs"]
            if before[node]["inputs"][name] != after[node]["inputs"][name]}


def test_arguments_parse_and_bad_ones_are_refused(bench):
    module, _ = bench
    args = module.parse_args(["--reps", "5", "--comfy", "0.3.64", "--json", "out.json", "--docs"])
    assert (args.reps, args.comfy, args.json, args.docs, args.quick) == (5, "0.3.64", "out.json", True, False)
    assert module.parse_args([]).comfy == "0.30.0"
    with pytest.raises(SystemExit):
        module.parse_args(["--reps", "0"])
    with pytest.raises(SystemExit):
        module.parse_args(["--client", "http://127.0.0.1:1"])  # the harness-side part needs --out


def test_each_stage_changes_one_thing_and_every_path_samples_the_same_latent(bench):
    _, workload = bench
    for path in workload.PATHS:
        first, strength, swap = (workload.workflow(path, stage) for stage in ("first", "strength", "swap"))
        assert _changed_inputs(first, strength) == {"0.5"}, path  # one strength, 1.0 -> 0.5, nothing else
        swapped = _changed_inputs(strength, swap)
        assert len(swapped) == 2 and all("_b_" in name for name in swapped), path  # both files of pair b, only
    ours = workload.workflow("lorabind_model", "first")
    native = workload.workflow("comfyui", "first")
    assert ours["4"]["inputs"]["width"] == native["7"]["inputs"]["width"] == workload.LATENT["width"]
    assert {n["class_type"] for n in native.values()} >= {"LoraLoaderModelOnly", "KSamplerAdvanced"}
    assert "LoraBindLoRAPair" in {n["class_type"] for n in workload.workflow("lorabind_pair", "swap").values()}


def test_the_table_gives_medians_and_ratios_to_comfyuis_loader(bench):
    module, _ = bench
    seconds = {("comfyui", "first"): 2.0, ("lorabind_pair", "first"): 1.0, ("lorabind_model", "first"): 4.0,
               ("comfyui", "strength"): 1.0, ("lorabind_pair", "strength"): 0.5,
               ("comfyui", "swap"): 1.0}
    result = {"comfy": "0.30.0", "size": "full size", "commit": "abc1234", "load_average": "1.00, 1.00, 1.00",
              "machine": {"cores": 2, "cpu": "Test CPU", "torch": "2.13.0+cpu"}, "records": _records(seconds)}
    assert module.medians(result["records"])[("comfyui", "first")] == pytest.approx(4.0)
    table = module.format_table(result)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[1] == "| first run | 4.00 s | 2.00 s (**0.50x**) | 8.00 s (**2.00x**) |"
    assert rows[2] == "| re-run, one strength changed | 2.00 s | 1.00 s (**0.50x**) | — |"
    assert rows[3].endswith("| — | — |") and "median of 2" in table and "Test CPU" in table


def test_the_docs_table_goes_between_its_own_markers_beside_run_alls(bench, tmp_path):
    module, _ = bench
    from lorabind.bench.history import _TABLE_END, _TABLE_START

    page_text = module.PAGE.read_text()
    assert module.TABLE_START in page_text and module.TABLE_END in page_text
    page = tmp_path / "benchmarks.md"
    page.write_text(f"{_TABLE_START}\nrun_all\n{_TABLE_END}\nmid\n{module.TABLE_START}\nold\n{module.TABLE_END}\nend\n")
    module.write_docs("| new |", page)
    assert page.read_text() == (f"{_TABLE_START}\nrun_all\n{_TABLE_END}\nmid\n{module.TABLE_START}\n\n| new |\n\n"
                                f"{module.TABLE_END}\nend\n")
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no ComfyUI bench table"):
        module.write_docs("| new |", page)
