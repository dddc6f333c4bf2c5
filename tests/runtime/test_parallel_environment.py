"""A hostile or mistaken torchrun environment fails at once, in one line, before any rendezvous (issue 52, item 5);
the job's secret and network interface are read the same strict way; degrees above the machine are refused by
name (issue 61, item 3); each rank gets its share of the cores (issue 60, item 5).

Each case runs the command in this process, so what is timed is the command alone (no interpreter start): on
main, ``RANK=7 WORLD_SIZE=2`` and ``RANK=1`` with nobody at ``MASTER_PORT`` waited until their 600 s timeout, and
``WORLD_SIZE=abc`` and ``LOCAL_RANK=x`` ended in tracebacks.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.distributed.process_group import ParallelRunError
from lorabind.runtime.cli import main
from lorabind.runtime.parallel import job_environment as environment
from lorabind.runtime.parallel.launch import free_port, rank_environment

WORKFLOW = Path(lorabind.__file__).parent / "workflows" / "api" / "qwen_image_lightning.api.json"
SECRET = "a job secret of enough characters"
BOUND_S = 10.0  # the bound for every bad environment
JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "LORABIND_JOB_SECRET", "LORABIND_JOB_SECRET_FILE", "LORABIND_JOB_STORE", "LORABIND_PARALLEL_INTERFACE",
                 "TORCHELASTIC_USE_AGENT_STORE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                 "LORABIND_RENDEZVOUS_TIMEOUT_S")


@pytest.fixture
def job_env(monkeypatch):
    """A clean torchrun-like environment for rank 1 of 2 on loopback; each case changes what it tests."""
    for name in JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    values = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(free_port()), "LORABIND_JOB_SECRET": SECRET}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def _refusal(command: str, tmp_path, capsys, *extra) -> tuple[str, float]:
    argv = ["run", str(WORKFLOW)] if command == "run" else ["serve", "--port", str(free_port())]
    started = time.monotonic()
    code = main([*argv, "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"),
                 "--parallel", "ulysses=2", *extra])
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    return lines[0], elapsed


@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize("changes, words", [
    ({"RANK": "7"}, "RANK=7 with WORLD_SIZE=2: the ranks of a job are numbered 0 to WORLD_SIZE-1"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a whole number (ASCII digits 0-9)"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not a whole number"),
    ({"RANK": "\u0661"}, "RANK='\u0661' is not a whole number"),  # Arabic-Indic 1: Python's int reads it
    ({"WORLD_SIZE": None}, "RANK is set but WORLD_SIZE is not"),
    ({"MASTER_PORT": "99999"}, "MASTER_PORT='99999' is not a port number"),
    ({"LORABIND_JOB_SECRET": None}, "this rank has no job secret: set LORABIND_JOB_SECRET"),
    ({"LORABIND_JOB_SECRET": "short"}, "the job secret is shorter than 16 characters"),
    ({"RANK": "0", "MASTER_ADDR": "192.0.2.7"}, "a job across hosts names the network interface its ranks listen "
                                                "on with --parallel-interface NAME"),
    ({"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}, "a job across hosts names the network interface"),
    ({"WORLD_SIZE": "4", "RANK": "3"}, "--parallel ulysses=2 needs 2 ranks, but WORLD_SIZE is 4"),
    ({}, "nobody answers at MASTER_ADDR:MASTER_PORT 127.0.0.1:"),  # rank 1, and no rank 0 anywhere
])
def test_a_bad_job_environment_is_one_line_within_the_bound(job_env, tmp_path, capsys, command, changes, words):
    for name, value in changes.items():
        job_env.delenv(name) if value is None else job_env.setenv(name, value)
    line, elapsed = _refusal(command, tmp_path, capsys)
    print(f"{command} {changes}: {elapsed:.1f} s: {line}")
    assert words in line and line.startswith(f"lorabind {command}: ") and elapsed < BOUND_S


def test_a_named_interface_that_does_not_exist_is_refused_by_name(job_env, tmp_path, capsys):
    line, _ = _refusal("run", tmp_path, capsys, "--parallel-interface", "nosuch9")
    assert "--parallel-interface nosuch9: no network interface of this host by that name" in line


def test_the_secret_file_must_be_a_private_regular_file(job_env, tmp_path):
    job_env.delenv("LORABIND_JOB_SECRET")
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    job_env.setenv("LORABIND_JOB_SECRET_FILE", str(secret))
    secret.chmod(0o644)
    with pytest.raises(ParallelRunError, match="can be read by other users: chmod 600 it"):
        environment.job_secret()
    secret.chmod(0o600)
    assert environment.job_secret() == SECRET.encode()
    os.mkfifo(tmp_path / "fifo", 0o600)  # a FIFO never blocks the read: refused as not a regular file
    job_env.setenv("LORABIND_JOB_SECRET_FILE", str(tmp_path / "fifo"))
    with pytest.raises(ParallelRunError, match="is not a regular file"):
        environment.job_secret()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_the_secret_leaves_the_environment_once_read(job_env):
    assert environment.job_secret() == SECRET.encode()
    assert "LORABIND_JOB_SECRET" not in os.environ  # nothing the rank starts inherits it


def test_the_job_listens_on_the_loopback_interface_unless_one_is_named():
    name, address = environment.listen_interface(None)
    assert address == "127.0.0.1" and environment.interface_address(name) == "127.0.0.1"


@pytest.mark.parametrize("command", ["run", "serve"])
def test_degrees_above_the_machine_are_refused_by_name(monkeypatch, tmp_path, capsys, command):
    for name in JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    argv = ["run", str(WORKFLOW)] if command == "run" else ["serve", "--port", str(free_port())]
    code = main([*argv, "--models", str(tmp_path / "models"), "--device", "cpu", "--parallel", "ulysses=100000,cfg=2"])
    captured = capsys.readouterr()
    cores = environment.usable_cores()
    assert code == 2 and time.monotonic() - started < BOUND_S
    assert (f"--parallel ulysses=100000,cfg=2 asks for 200000 ranks, one per CPU core, but this machine has "
            f"{cores} CPU core") in captured.out + captured.err
    assert "starting" not in captured.out


def test_each_rank_started_here_gets_its_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = rank_environment(1, 2, "127.0.0.1", 29500, "s" * 32)
    assert env["OMP_NUM_THREADS"] == str(max(1, environment.usable_cores() // 2))
    assert env["LORABIND_JOB_SECRET"] == "s" * 32 and env["MASTER_ADDR"] == "127.0.0.1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own choice wins, as under torchrun
    assert rank_environment(1, 2, "127.0.0.1", 29500, "s" * 32)["OMP_NUM_THREADS"] == "3"
