"""Issue 31's two server attacks, measured against a running ``lorabind serve`` (``python -m bench.load_test
--hostile``): how long ``GET /queue`` takes while two 90 MB bodies of small objects are posted (it was 52 s), and
what contract lookups of a LoRA with a 90 MB header (800K empty tensors) cost in time and server memory (the
first took 67 s and 1.5 GB, and every repeat the same). Issue 46's files are asked for too
(``hostile_files46``): contract words declaring 10^9 steps (the server passed 7.6 GB) and a GGUF whose metadata
holds 999,999 empty strings (45 s and 1.6 GB in the gguf package's reader). The hostile files are generated
here, in the temporary models root.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp

from .hostile_files46 import measure_issue46, write_issue46_models

BODY_OBJECTS = 11_500_000  # about 90 MB of {"a":1}
HEADER_TENSORS = 800_000
HOSTILE_LORA = "hostile-header.safetensors"
REPEATS = 20


def proc_status_mib(pid: int, field: str) -> float | None:
    """A memory field of /proc/PID/status (VmRSS: now, VmHWM: peak) in MiB; None off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def write_hostile_models(models: str) -> None:
    """``loras/hostile-header.safetensors``: 800K empty tensors, a header of about 90 MB and no data."""
    loras = Path(models, "loras")
    loras.mkdir(parents=True, exist_ok=True)
    entry = b'"lora_unet_double_blocks_%07d_img_attn_qkv_proj.lora_down.weight":' \
            b'{"dtype":"F16","shape":[0,64],"data_offsets":[0,0]}'
    header = b"{" + b",".join(entry % i for i in range(HEADER_TENSORS)) + b"}"
    (loras / HOSTILE_LORA).write_bytes(struct.pack("<Q", len(header)) + header)
    write_issue46_models(models)


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> str:
    started = time.perf_counter()
    try:
        async with session.post(f"{url}/prompt", data=body, headers={"Content-Type": "application/json"}) as resp:
            outcome = str(resp.status)
    except aiohttp.ClientError as exc:  # the server may close the connection once it has refused the body
        outcome = type(exc).__name__
    return f"{outcome} after {time.perf_counter() - started:.2f} s"


def _poll_queue(url: str, until: threading.Event) -> list[float]:
    """Seconds per ``GET /queue``, asked from this thread (its own connection, not the posting loop's) until set."""
    latencies = []
    while not until.is_set():
        started = time.perf_counter()
        with urllib.request.urlopen(f"{url}/queue", timeout=600) as resp:
            resp.read()
        latencies.append(time.perf_counter() - started)
        until.wait(0.05)
    return latencies


async def _queue_when_idle(url: str, seconds: float = 2.0) -> float:
    """The slowest ``GET /queue`` over ``seconds`` with nothing else going on: this machine's noise floor."""
    done = threading.Event()
    polling = asyncio.ensure_future(asyncio.to_thread(_poll_queue, url, done))
    await asyncio.sleep(seconds)
    done.set()
    return max(await polling)


async def _queue_during_big_posts(url: str) -> tuple[float, int, list[str]]:
    """(slowest GET /queue, how many were asked, the posts' outcomes) while two 90 MB bodies are posted."""
    body = b'{"prompt": {"1": {"class_type": "x", "inputs": {}}}, "extra_data": {"junk": [' \
        + b",".join([b'{"a":1}'] * BODY_OBJECTS) + b"]}}"
    done = threading.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        polling = asyncio.ensure_future(asyncio.to_thread(_poll_queue, url, done))
        await asyncio.sleep(0.2)
        posts = await asyncio.gather(*(_post(session, url, body) for _ in range(2)))
        done.set()
        latencies = await polling
    return max(latencies), len(latencies), posts


async def _contract_lookups(url: str, pid: int) -> dict:
    """The first lookup of the hostile LoRA, then ``REPEATS`` more: times, answers and the server's RSS."""
    query = {"name": HOSTILE_LORA}
    async with aiohttp.ClientSession() as session:
        rss_before = proc_status_mib(pid, "VmRSS")
        times, answers = [], []
        for _ in range(1 + REPEATS):
            started = time.perf_counter()
            async with session.get(f"{url}/lorabind/contract", params=query) as resp:
                answers.append((resp.status, (await resp.json()).get("reason")))
            times.append(time.perf_counter() - started)
            if len(times) == 1:
                rss_first = proc_status_mib(pid, "VmRSS")
    return {"first_s": times[0], "repeat_ms": [t * 1000 for t in times[1:]], "answers": answers,
            "rss_mib": (rss_before, rss_first, proc_status_mib(pid, "VmRSS"))}


async def measure_hostile(url: str, pid: int) -> int:
    issue46_ok = await measure_issue46(url, pid, _poll_queue)
    lookups = await _contract_lookups(url, pid)
    idle = await _queue_when_idle(url)
    slowest, asked, posts = await _queue_during_big_posts(url)
    print("hostile requests (issue 31), loopback:")
    print(f"  GET /queue while two 90 MB bodies are posted: slowest {slowest:.3f} s of {asked} asked "
          f"(idle: slowest {idle:.3f} s)")
    print(f"  the two posts: {'; '.join(posts)}")
    status, reason = lookups["answers"][0]
    repeat = lookups["repeat_ms"]
    print(f"  contract lookup of a LoRA with a 90 MB header: first {lookups['first_s'] * 1000:.1f} ms -> {status} "
          f"({reason})")
    print("  repeats (ms):", " ".join(f"{ms:.1f}" for ms in repeat))
    print(f"  {len(repeat)} repeats: mean {sum(repeat) / len(repeat):.2f} ms, max {max(repeat):.2f} ms; "
          "server RSS before / after the first / after the repeats: "
          + " / ".join(f"{mib:.0f} MiB" for mib in lookups["rss_mib"]))
    same = len(set(lookups["answers"])) == 1
    ok = slowest < 1.0 and status == 422 and same and max(repeat) < 10
    print("  OK" if ok else "  FAILED: a figure is over its goal (/queue < 1 s, lookups refused, repeats < 10 ms)")
    return 0 if ok and issue46_ok else 1
