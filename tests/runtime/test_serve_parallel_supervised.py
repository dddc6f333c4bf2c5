"""``lorabind serve --parallel ulysses=2`` as a user starts it (the command, which becomes rank 0 and starts rank
1), attacked and broken on purpose, over two CPU ranks:

- issue 52, item 1: no socket of the job listens beyond loopback; a store client without the job's secret reads
  no comfy.org token and cannot steer a rank (what it writes is ignored and reported);
- issue 60, item 3: a cfg breach sent to the cold server is a 400 before anything is queued (no rank loads);
- issue 60, item 2: rank 1 killed mid-prompt fails that prompt naming the rank; a prompt queued behind it runs on
  ranks started again;
- issue 61, item 1: rank 1 stopped (SIGSTOP) fails its prompt within ``--rank-timeout`` (3 s here) naming it, and
  the next prompt runs;
- issue 53: SIGINT and SIGTERM end every rank with 0, no traceback and no "rank N failed";
- ranks started by hand (as torchrun starts them, with the user's secret): rank 1 killed mid-prompt fails the
  prompt naming it, and rank 0, which cannot start it again, stops saying it is healthy: it says why and exits 1.

Measured on this machine (2 cores, shared): the stalled rank's prompt failed 3.5-5 s after SIGSTOP; the ranks
started again and the next prompt finished within 20 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

import lorabind
from job_processes import children, environment_of, is_loopback, listening_sockets, process_tree
from lorabind.runtime.parallel.launch import free_port
from server_client import Client, run_async

pytestmark = pytest.mark.slow

TEMPLATE = Path(lorabind.__file__).parent / "workflows" / "api" / "qwen_image_lightning.api.json"
RANK_TIMEOUT_S = 3
TOKENS = {"auth_token_comfy_org": "comfy-org-token-52-1", "api_key_comfy_org": "comfy-org-key-52-1"}
WAIT_S = 240.0


class Served:
    """The command's process, its output files, and its URL."""

    def __init__(self, process, url: str, log: Path):
        self.process, self.url, self.log = process, url, log

    def rank_one(self) -> int:
        (pid,) = children(self.process.pid)
        return pid

    def stderr(self) -> str:
        return (self.log / "stderr").read_text(errors="replace")


def _start(root: Path, tiny_models_root, name: str, *extra) -> Served:
    port = free_port()
    log = root / name
    log.mkdir()
    argv = [sys.executable, "-m", "lorabind", "serve", "--port", str(port), "--models", str(tiny_models_root),
            "--output", str(root / "output"), "--input", str(root / "input"), "--temp", str(root / "temp"),
            "--state-dir", str(log / "state"), "--parallel", "ulysses=2", *extra]
    env = {**os.environ, "PYTHONPATH": str(Path(lorabind.__file__).parent.parent)}
    with open(log / "stdout", "w") as out, open(log / "stderr", "w") as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True)
    served = Served(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, served.stderr()
        try:
            urllib.request.urlopen(served.url + "/system_stats", timeout=2).close()
            return served
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"serve --parallel did not answer within {WAIT_S} s")


def _stop(served: Served) -> None:
    if served.process.poll() is None:
        os.killpg(served.process.pid, signal.SIGKILL)
    for pid in process_tree(served.process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    served.process.wait(30)


@pytest.fixture(scope="module")
def served(tiny_models_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_supervised")
    job = _start(root, tiny_models_root, "job", "--rank-timeout", str(RANK_TIMEOUT_S))
    yield job
    _stop(job)


def _template(**sampler) -> dict:
    prompt = json.loads(TEMPLATE.read_text())
    prompt["6"]["inputs"].update(sampler)
    return prompt


LONG = {"model": ["1", 0], "steps": 400}  # no distill LoRA: any step count; long enough to break it midway


async def _queue(served: Served, prompts: list, client_id: str, extra: dict | None = None, during=None) -> dict:
    """Queue ``prompts`` in order and wait until each has ended; ``during(progress)`` is called on the first
    prompt's progress messages. Returns {prompt id: (history entry, its execution_error or None)} in order."""
    client = Client(served.url, client_id=client_id)
    try:
        await client.connect()
        ids = [(await client.queue_prompt(p, extra_data=extra or {}))["prompt_id"] for p in prompts]
        errors, done = {}, set()
        while len(done) < len(ids):
            message = await client.receive(timeout=WAIT_S)
            data = message.get("data", {})
            if message["type"] == "progress" and data.get("prompt_id") == ids[0] and during is not None:
                during(data)
            if message["type"] == "execution_error":
                errors[data["prompt_id"]] = data
            if message["type"] == "executing" and data.get("node") is None and data.get("prompt_id") in ids:
                done.add(data["prompt_id"])
        results = {}
        for prompt_id in ids:
            status, history = await client.get(f"/history/{prompt_id}")
            results[prompt_id] = (history[prompt_id], errors.get(prompt_id))
        return results
    finally:
        await client.close()


def test_a_cfg_breach_is_refused_with_400_before_anything_is_queued(served):
    async def body():
        client = Client(served.url)
        try:
            return await client.post("/prompt", {"prompt": _template(cfg=5.0)})
        finally:
            await client.close()

    status, reply = run_async(body)
    error = reply["node_errors"]["6"]["errors"][0]
    assert status == 400 and error["extra_info"] == {"input_name": "cfg", "received_value": 5.0,
                                                     "lorabind_refusal": "contract_mismatch"}
    assert "cfg must be 1, got 5" in error["details"]
    assert "queued" not in served.stderr()  # nothing reached the queue: no rank loaded or ran anything


def test_no_socket_of_the_job_listens_beyond_loopback(served):
    pids = process_tree(served.process.pid)
    sockets = listening_sockets(pids)
    print(f"the job's listening sockets: {sockets}")
    assert len(pids) == 2 and {pid for _, _, pid in sockets} == set(pids)  # rank 1 listens too (gloo)
    assert len(sockets) >= 4  # HTTP, the job's store, gloo on each rank
    assert all(is_loopback(address) for address, _, _ in sockets)


def test_a_store_client_without_the_secret_reads_no_token_and_cannot_steer_a_rank(served):
    port = int(environment_of(served.rank_one())["MASTER_PORT"])  # the job's store (same user: readable)
    foreign = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
    seen, forged = [], []

    def during(progress: dict) -> None:
        keys = foreign.list_keys()
        seen.extend(bytes(foreign.compare_set(key, "\0", "\0")) for key in keys)  # never waits for a deleted key
        commands = [key for key in keys if key.rsplit("/", 1)[-1].startswith("cmd")]
        if commands and not forged:  # the next command, as a stranger writes it: unsigned, and at the plain name
            number = max(int(key.rsplit("cmd", 1)[1]) for key in commands) + 1
            foreign.set(commands[0].rsplit("cmd", 1)[0] + f"cmd{number}", '{"kind": "stop"}')
            foreign.set(f"cmd{number}", '{"kind": "stop"}')
            forged.append(number)

    results = run_async(_queue, served, [_template(model=["1", 0], steps=30), _template()], "foreign-client",
                        TOKENS, during)
    assert seen and forged, "the prompt ended before the foreign client looked"
    assert any(b'"prompt_id"' in value for value in seen)  # it did read the command: signed, not secret
    assert not any(token.encode() in value for value in seen for token in TOKENS.values())
    assert [entry["status"]["status_str"] for entry, _ in results.values()] == ["success", "success"]
    assert "not signed with this job's secret" in served.stderr()


def _wait_for_step(step: int, act):
    state = {"done": False}

    def during(progress: dict) -> None:
        if not state["done"] and progress["value"] >= step:
            state["done"] = True
            state["at"] = time.monotonic()
            act()
    return during, state


def test_a_rank_killed_mid_prompt_fails_that_prompt_naming_it_and_the_queue_goes_on(served):
    rank_one = served.rank_one()
    during, state = _wait_for_step(2, lambda: os.kill(rank_one, signal.SIGKILL))
    results = run_async(_queue, served, [_template(**LONG), _template()], "killed-rank", {}, during)
    (first, error), (second, _) = results.values()
    assert state["done"] and error is not None and first["status"]["status_str"] == "error"
    print(f"the client's error: {error['exception_message'].strip()}")
    assert error["exception_message"].startswith("rank 1 of 2 stopped (killed by SIGKILL)")
    assert second["status"]["status_str"] == "success"  # queued behind it, run on the ranks started again
    assert served.rank_one() != rank_one and "the job's 2 ranks started again" in served.stderr()


def test_a_stalled_rank_fails_its_prompt_within_the_rank_timeout_naming_it(served):
    rank_one = served.rank_one()
    during, state = _wait_for_step(2, lambda: os.kill(rank_one, signal.SIGSTOP))
    ((entry, error),) = run_async(_queue, served, [_template(**LONG)], "stalled-rank", {}, during).values()
    waited = time.monotonic() - state["at"]
    print(f"the stalled rank's prompt failed {waited:.1f} s after SIGSTOP: {error['exception_message'].strip()}")
    assert entry["status"]["status_str"] == "error"
    assert error["exception_message"].startswith(f"rank 1 of 2 stopped responding (no heartbeat for "
                                                 f"{RANK_TIMEOUT_S} s, --rank-timeout)")
    assert waited < RANK_TIMEOUT_S + 15  # the bound, plus the heartbeat's poll and a loaded machine's lag
    assert not os.path.exists(f"/proc/{rank_one}/stat") or "Z" in open(f"/proc/{rank_one}/stat").read().split()[2]
    ((after, _),) = run_async(_queue, served, [_template()], "after-stall").values()
    assert after["status"]["status_str"] == "success"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_every_rank_with_0_and_no_traceback(tiny_models_root, tmp_path, signum):
    job = _start(tmp_path, tiny_models_root, "signalled")
    try:
        ((entry, _),) = run_async(_queue, job, [_template()], "before-signal").values()
        assert entry["status"]["status_str"] == "success"
        pids = process_tree(job.process.pid)
        os.killpg(job.process.pid, signum)  # as Ctrl-C in a terminal: the foreground process group
        code = job.process.wait(60)
        stderr = job.stderr()
        print(f"{signal.Signals(signum).name}: exit {code}; stderr ends: {stderr.strip().splitlines()[-2:]}")
        assert code == 0 and "Traceback" not in stderr and "failed" not in stderr
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    finally:
        _stop(job)


def test_ranks_started_by_hand_name_a_lost_rank_and_stop_serving(tiny_models_root, tmp_path):
    port, master = free_port(), free_port()
    ranks = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(Path(lorabind.__file__).parent.parent), "RANK": str(rank),
               "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master),
               "LORABIND_JOB_SECRET": "the user's own secret for both ranks", "LORABIND_RENDEZVOUS_TIMEOUT_S": "120",
               "OMP_NUM_THREADS": "1"}
        with open(tmp_path / f"rank{rank}.err", "w") as err:
            ranks.append(subprocess.Popen(
                [sys.executable, "-m", "lorabind", "serve", "--port", str(port), "--models", str(tiny_models_root),
                 "--output", str(tmp_path / "output"), "--state-dir", str(tmp_path / "state"),
                 "--parallel", "ulysses=2", "--rank-timeout", str(RANK_TIMEOUT_S)],
                env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))
    job = Served(ranks[0], f"http://127.0.0.1:{port}", tmp_path)
    (tmp_path / "stderr").symlink_to(tmp_path / "rank0.err")
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(job.url + "/system_stats", timeout=2).close()
                break
            except OSError:
                assert ranks[0].poll() is None, job.stderr()
                time.sleep(0.5)
        during, state = _wait_for_step(2, lambda: ranks[1].kill())
        ((entry, error),) = run_async(_queue, job, [_template(**LONG)], "by-hand", {}, during).values()
        assert state["done"] and entry["status"]["status_str"] == "error"
        assert error["exception_message"].startswith("rank 1 of 2 stopped")
        assert "ranks started by torchrun cannot be started again by the job, so the server stops" in \
            error["exception_message"]
        assert ranks[0].wait(60) == 1
        assert "stopping" in job.stderr() and "Traceback" not in job.stderr()
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
            process.wait(30)
