"""How ``run --parallel``'s launcher reads its ranks' exits (``launch._wait_for``): rank 0's code is the job's
once it ends (on the job's protocol it has said what failed, naming the rank); a failed rank while rank 0 runs on
gets rank 0 a grace to end, and only a rank 0 that does not end (blocked in a collective) makes the launcher name
the failed rank itself."""

from __future__ import annotations

import pytest

from lorabind.runtime.parallel import launch


class FakeRank:
    """A rank whose exit code is ``code`` from the ``after``-th poll on (None before)."""

    def __init__(self, code, after: int = 0):
        self.code, self.after, self.polls = code, after, 0

    def poll(self):
        self.polls += 1
        return self.code if self.polls > self.after else None


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(launch, "POLL_S", 0.001)
    monkeypatch.setattr(launch, "FAILURE_GRACE_S", 0.05)


def test_rank_0_reporting_a_failure_is_the_job_code_and_the_launcher_adds_no_line(capsys):
    assert launch._wait_for([FakeRank(1, after=5), FakeRank(1)], "run") == 1
    assert capsys.readouterr().err == ""


def test_a_rank_0_that_never_ends_after_a_peer_failed_is_stopped_naming_the_peer(capsys):
    assert launch._wait_for([FakeRank(None), FakeRank(3)], "run") == 3
    assert capsys.readouterr().err.strip() == "lorabind run: rank 1 of 2 failed (exit code 3); ranks 0 stopped"


def test_rank_0_succeeding_while_a_peer_failed_names_the_peer(capsys):
    assert launch._wait_for([FakeRank(0, after=2), FakeRank(1)], "run") == 1
    assert "rank 1 of 2 failed (exit code 1)" in capsys.readouterr().err


def test_every_rank_interrupted_is_130_without_a_line(capsys):
    assert launch._wait_for([FakeRank(130, after=1), FakeRank(130)], "run") == 130
    assert capsys.readouterr().err == ""


def test_every_rank_succeeding_is_0():
    assert launch._wait_for([FakeRank(0, after=3), FakeRank(0, after=1)], "run") == 0
