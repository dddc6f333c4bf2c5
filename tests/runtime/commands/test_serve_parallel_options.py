"""``lorabind serve --parallel`` refuses what this build cannot run before it starts any rank (fast: no ranks)."""

from __future__ import annotations

from lorabind.runtime.cli import main


def test_serve_refuses_tp_combined_with_a_sequence_split_before_starting_ranks(tmp_path, capsys):
    code = main(["serve", "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"),
                 "--tensor-parallel-size", "2", "--ulysses-degree", "2"])
    assert code == 2
    out = capsys.readouterr().out
    assert "lorabind serve: --parallel ulysses=2,tp=2: tp=2 cannot be combined with ulysses=2" in out
    assert "starting" not in out and not (tmp_path / "out").exists()


def test_serve_names_a_bad_degree(tmp_path, capsys):
    assert main(["serve", "--models", str(tmp_path / "models"), "--parallel", "ulysses=two"]) == 2
    assert "lorabind serve: " in capsys.readouterr().out
