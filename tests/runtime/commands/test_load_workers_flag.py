"""``--load-workers N`` on ``run`` and ``serve``, with vllm-omni's ``--num-weight-load-threads`` as its alias
(issue 44 item 7): the threads every model load of the command reads its weight files with."""

from __future__ import annotations

import os

import pytest

from lorabind.runtime.cli import build_parser, main
from lorabind.runtime.device_options import apply_device_arguments

pytestmark = pytest.mark.usefixtures("load_workers_restored")  # the flags set it process-wide


@pytest.mark.parametrize("command", [["run", "w.json"], ["serve"]])
@pytest.mark.parametrize("flag", ["--load-workers", "--num-weight-load-threads"])
def test_both_spellings_set_the_loading_threads_of_run_and_serve(command, flag):
    args = build_parser().parse_args([*command, flag, "3"])
    assert args.load_workers == 3
    assert apply_device_arguments(args) is None and os.environ["LORABIND_LOAD_WORKERS"] == "3"


def test_without_the_flag_the_loader_keeps_its_rule():
    os.environ.pop("LORABIND_LOAD_WORKERS", None)
    args = build_parser().parse_args(["run", "w.json"])
    assert args.load_workers is None and apply_device_arguments(args) is None
    assert "LORABIND_LOAD_WORKERS" not in os.environ


@pytest.mark.parametrize("argv, words", [
    (["run", "w.json", "--load-workers", "0"], "lorabind run: --load-workers must be at least 1, got 0"),
    (["serve", "--num-weight-load-threads", "4", "--disable-multithread-weight-load"],
     "--disable-multithread-weight-load and --load-workers (--num-weight-load-threads) 4 contradict each other"),
])
def test_a_count_below_one_or_a_contradiction_is_refused_in_one_line(argv, words, capsys, tmp_path):
    assert main([*argv, "--models", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert words in captured.out + captured.err
