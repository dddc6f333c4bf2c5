"""Bounded load test of ``lorabind serve`` on loopback: N concurrent clients each queue M prompts of the tiny
Wan2.2 workflow, and we check that none is lost, none runs twice, and every client receives only its own
execution messages. Prints throughput and the server's peak RSS.

Run: ``python -m bench.load_test`` (8 clients x 25 prompts) or ``python -m bench.load_test --quick``.
``--hostile`` measures issue 31's attacks instead: how long ``GET /queue`` takes while two 90 MB bodies of small
objects are posted, and what contract lookups of a LoRA with a 90 MB header (800K empty tensors) cost; then
issue 52's attacks on a ``serve --parallel ulysses=2`` job's rank channel (``bench/hostile_ranks.py``) and its
weight file truncated under the server (``hostile_files52``: the server must live and refuse the prompt by name).
The server is a real ``lorabind serve`` subprocess on a free 127.0.0.1 port with a temporary models/output
root; it is stopped at the end, and the whole run is bounded by ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from .hostile_files52 import measure_issue52, write_issue52_models
from .hostile_ranks import measure_hostile_ranks
from .hostile_requests import measure_hostile, proc_status_mib, write_hostile_models

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "workflows" / "api" / "wan22_tiny_t2v.api.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mib(pid: int) -> float | None:
    """VmHWM (peak resident set) of the server process, from /proc (Linux)."""
    return proc_status_mib(pid, "VmHWM")


def _prompt(seed: int, prefix: str) -> dict:
    """The example workflow with its own seed (so nothing is a cache hit) and output prefix."""
    prompt = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    for node in prompt.values():
        if node["class_type"] == "LoraBindSampler":
            node["inputs"]["seed"] = seed
        if "filename_prefix" in node["inputs"]:
            node["inputs"]["filename_prefix"] = prefix
    return prompt


async def _wait_until_up(url: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"lorabind serve exited with code {process.returncode}")
            try:
                async with session.get(f"{url}/system_stats") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"lorabind serve did not answer within {timeout:.0f} s")


class ClientRun:
    """One client: its own WebSocket, its prompts, and every message it received."""

    def __init__(self, url: str, index: int, prompts: int):
        self.url, self.index, self.count = url, index, prompts
        self.client_id = f"load-{index}"
        self.prompt_ids: list[str] = []
        self.messages: list[dict] = []
        self.done: Counter = Counter()
        self.started: Counter = Counter()

    async def run(self, session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(f"{self.url}/ws?clientId={self.client_id}") as ws:
            for i in range(self.count):
                body = {"prompt": _prompt(seed=self.index * 1000 + i, prefix=f"load/c{self.index}_{i}"),
                        "client_id": self.client_id}
                async with session.post(f"{self.url}/prompt", json=body) as resp:
                    reply = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(f"client {self.index}: /prompt answered {resp.status}: {reply}")
                    self.prompt_ids.append(reply["prompt_id"])
            pending = set(self.prompt_ids)
            while pending:
                msg = await ws.receive()
                if msg.type == aiohttp.WSMsgType.BINARY:  # a live preview of a step
                    continue
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise RuntimeError(f"client {self.index}: websocket closed with {pending and len(pending)} "
                                       "prompts unfinished")
                message = json.loads(msg.data)
                self.messages.append(message)
                data = message.get("data", {})
                if message["type"] == "execution_start":
                    self.started[data["prompt_id"]] += 1
                if message["type"] == "executing" and data.get("node") is None:
                    self.done[data["prompt_id"]] += 1
                    pending.discard(data["prompt_id"])

    def problems(self, history: dict) -> list[str]:
        own = set(self.prompt_ids)
        found = []
        foreign = {m["data"].get("prompt_id") for m in self.messages if m["type"] != "status"} - own - {None}
        if foreign:
            found.append(f"client {self.index} received messages of {len(foreign)} other prompts")
        if len(own) != self.count:
            found.append(f"client {self.index}: {len(own)} distinct prompt ids for {self.count} submissions")
        for pid in self.prompt_ids:
            if self.done[pid] != 1 or self.started[pid] != 1:
                found.append(f"client {self.index}: prompt {pid} started {self.started[pid]}x, "
                             f"finished {self.done[pid]}x")
            entry = history.get(pid)
            if entry is None:
                found.append(f"client {self.index}: prompt {pid} missing from /history")
            elif entry["status"]["status_str"] != "success":
                found.append(f"client {self.index}: prompt {pid} ended with {entry['status']}")
        return found


async def _load(url: str, clients: int, prompts: int) -> tuple[float, list[str], int]:
    async with aiohttp.ClientSession() as session:
        # warm-up: builds the tiny model if missing and loads it, outside the measurement
        warm = ClientRun(url, 999, 1)
        await warm.run(session)
        runs = [ClientRun(url, i, prompts) for i in range(clients)]
        start = time.perf_counter()
        await asyncio.gather(*(run.run(session) for run in runs))
        elapsed = time.perf_counter() - start
        async with session.get(f"{url}/history") as resp:
            history = await resp.json()
        async with session.get(f"{url}/queue") as resp:
            queue = await resp.json()
    problems = [p for run in runs for p in run.problems(history)]
    if queue["queue_pending"] or queue["queue_running"]:
        problems.append(f"queue not empty at the end: {queue}")
    ran = sum(len(run.prompt_ids) for run in runs)
    return elapsed, problems, ran


@contextlib.contextmanager
def _serving(tmp: str, models: str):
    """A ``lorabind serve`` subprocess on a free loopback port, stopped (SIGINT) on exit; yields (url, pid)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "lorabind.runtime.cli", "serve", "--listen", "127.0.0.1",
               "--port", str(port), "--models", models, "--output", os.path.join(tmp, "output"),
               "--input", os.path.join(tmp, "input"), "--temp", os.path.join(tmp, "temp")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log_path = Path(tmp) / "server.log"  # a file, not a pipe: an unread pipe would block the server
    with open(log_path, "w") as log, subprocess.Popen(command, env=env, stdout=log, stderr=log) as server:
        try:
            asyncio.run(_wait_until_up(url, server, timeout=120))
            yield url, server.pid
        except BaseException:
            print(f"server log (last lines):\n{log_path.read_text()[-3000:]}", file=sys.stderr)
            raise
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=25, help="prompts per client")
    parser.add_argument("--quick", action="store_true", help="2 clients x 3 prompts")
    parser.add_argument("--hostile", action="store_true",
                        help="instead: GET /queue while two 90 MB bodies are posted, and contract lookups of a LoRA "
                             "with a 90 MB header (bench/hostile_requests.py); a weight file truncated under the "
                             "server (bench/hostile_files52.py); then a foreign client against a serve --parallel "
                             "job's rank channel (bench/hostile_ranks.py)")
    parser.add_argument("--models", default=None, help="models root (default: a temporary one, built on demand)")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.prompts = 2, 3

    with tempfile.TemporaryDirectory(prefix="lorabind-load-") as tmp:
        models = args.models or os.path.join(tmp, "models")
        if args.hostile:
            write_hostile_models(models)
            write_issue52_models(models)
            with _serving(tmp, models) as (url, pid):
                code = asyncio.run(asyncio.wait_for(measure_hostile(url, pid), timeout=args.timeout))
                truncated_ok = asyncio.run(asyncio.wait_for(measure_issue52(url, pid, models), timeout=args.timeout))
            return max(code, 0 if truncated_ok else 1, measure_hostile_ranks(args.timeout))
        with _serving(tmp, models) as (url, pid):
            elapsed, problems, ran = asyncio.run(
                asyncio.wait_for(_load(url, args.clients, args.prompts), timeout=args.timeout))
            peak = _peak_rss_mib(pid)

    print(f"load test: {args.clients} clients x {args.prompts} prompts = {ran} prompts (tiny Wan2.2, loopback)")
    print(f"  wall time   {elapsed:8.2f} s")
    print(f"  throughput  {ran / elapsed:8.2f} prompts/s")
    print(f"  server peak RSS {peak:.0f} MiB" if peak is not None else "  server peak RSS: unavailable")
    if problems:
        print(f"  FAILED: {len(problems)} problem(s)")
        for problem in problems[:20]:
            print("   -", problem)
        return 1
    print("  OK: none lost, none duplicated, every client saw only its own prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
