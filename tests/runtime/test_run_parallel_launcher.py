"""``lorabind run WF --parallel ulysses=2`` as a user starts it (the launcher and its two ranks), watched from
outside while it runs: no socket of the job listens beyond loopback (issue 52, item 1: on main the job's TCPStore
listened on every interface), the job's secret is in no command line, and each rank runs with its share of the
cores (issue 60, item 5: on main every rank took all of them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lorabind
from job_processes import environment_of, is_loopback, listening_sockets, process_tree
from lorabind.runtime.parallel.job_environment import usable_cores

pytestmark = pytest.mark.slow

WORKFLOW = Path(lorabind.__file__).parent / "workflows" / "api" / "qwen_image_lightning.api.json"


def test_the_job_listens_on_loopback_only_and_keeps_its_secret_off_command_lines(tiny_models_root, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(Path(lorabind.__file__).parent.parent)
    process = subprocess.Popen([sys.executable, "-m", "lorabind", "run", str(WORKFLOW), "--models",
                                str(tiny_models_root), "--output", str(tmp_path / "out"), "--input",
                                str(tmp_path / "in"), "--parallel", "ulysses=2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    sockets, ranks, command_lines = set(), {}, []
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        tree = process_tree(process.pid)
        sockets.update(listening_sockets(tree))
        for pid in tree[1:]:
            try:
                ranks.setdefault(pid, environment_of(pid))
                command_lines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                pass
        time.sleep(0.1)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    print(f"the job's listening sockets: {sorted(sockets)}")
    assert len({pid for _, _, pid in sockets}) == 3  # the launcher (the job's store) and both ranks (gloo)
    assert all(is_loopback(address) for address, _, _ in sockets)
    environments = [e for e in ranks.values() if "RANK" in e]
    assert sorted(e["RANK"] for e in environments) == ["0", "1"]
    secrets = {e["LORABIND_JOB_SECRET"] for e in environments}
    assert len(secrets) == 1 and not any(secret.encode() in line for secret in secrets for line in command_lines)
    assert {e["OMP_NUM_THREADS"] for e in environments} == {str(max(1, usable_cores() // 2))}


def test_ctrl_c_stops_the_launcher_and_its_ranks_quietly(tiny_models_root, tmp_path):
    """A terminal's Ctrl-C reaches the launcher's process group only (each rank runs in a session of its own): the
    launcher stops its ranks and exits 130, without a traceback from any of them."""
    prompt = json.loads(WORKFLOW.read_text())
    prompt["6"]["inputs"].update(model=["1", 0], steps=1000)  # no distill LoRA: any step count; long
    workflow = tmp_path / "long.api.json"
    workflow.write_text(json.dumps(prompt))
    env = {**os.environ, "PYTHONPATH": str(Path(lorabind.__file__).parent.parent)}
    process = subprocess.Popen([sys.executable, "-m", "lorabind", "run", str(workflow), "--models",
                                str(tiny_models_root), "--output", str(tmp_path / "out"), "--parallel", "ulysses=2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                               start_new_session=True)
    deadline = time.monotonic() + 300
    while len(process_tree(process.pid)) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks = process_tree(process.pid)[1:]
    time.sleep(3)  # into the run
    os.killpg(process.pid, signal.SIGINT)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 130 and "Traceback" not in output and "failed" not in output, output
    assert len(ranks) == 2 and not any(os.path.exists(f"/proc/{pid}") for pid in ranks)
