"""Serving many users at once (issue 53): ``serve --max-batch 4`` against ``--max-batch 1`` through the HTTP and
WebSocket API, with the method of vllm-omni's ``diffusion_benchmark_serving.py``: a fixed number of prompts, Poisson
arrivals at a given request rate, and a client concurrency (a prompt is sent only while fewer than that many are
in flight). Every prompt is its own client: it posts ``/prompt`` and reads its own WebSocket events.

Four settings, one server each (in this process, a real listening server; the model stays loaded between them):
serial and batched, each with one binding (every prompt fuses the same published-layout distill LoRA) and with
four LoRAs (prompt ``i`` fuses plain rank-``size.rank`` style LoRA ``i % 4``: serial re-binds between prompts,
batched applies each to its own rows). Per setting: throughput (prompts/s from the first send to the last
result), mean/p50/p99 latency, and the time to each prompt's first denoising step (send to its sampler's first
``progress`` event), of which the prompts that arrive while others run are the ones issue 53 is about.

Figures: ``serving_batched_vs_serial`` (one binding, throughput batched / serial, goal >= 1.5),
``serving_mixed_lora_vs_serial`` (four LoRAs, goal >= 1.3) and ``serving_first_step_s`` (median time to the first
step of the batched one-binding prompts that arrived mid-run), stated beside ``serving_step_s`` (the median time
between two steps of a prompt there).

Sizes: the end-to-end case's models (``bench_end_to_end``: Wan2.1-1.3B's transformer, VAE and a small UMT5, random
weights, 64x64, 1 frame, 4 steps); ``--quick``: its tiny sizes and fewer prompts (the smoke test).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time

import aiohttp

from lorabind.loaders.models import store
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer

from .bench_end_to_end import FULL_CASE, LORA_A, MODEL_NAME, QUICK_CASE, WORKFLOW, write_loras, write_model
from .workload import write_lora

CONCURRENCY = 4
REQUEST_RATE = 4.0  # prompts per second, Poisson: faster than one is served, so the concurrency is reached
SETTINGS = (("serial", 1, "one"), ("batched", CONCURRENCY, "one"), ("serial", 1, "four"),
            ("batched", CONCURRENCY, "four"))
STYLES = tuple(f"bench_style_{i}.safetensors" for i in range(4))
FIGURES = ("serving_batched_vs_serial", "serving_mixed_lora_vs_serial", "serving_first_step_s", "serving_step_s")


def run(workdir: str, quick: bool) -> dict:
    case = QUICK_CASE if quick else FULL_CASE
    root = os.path.join(workdir, "serving")
    write_model(root, case)
    write_loras(os.path.join(root, "loras"), case.size)
    for seed, name in enumerate(STYLES, start=21):
        write_lora(os.path.join(root, "loras", name), case.size, seed=seed, bias_diffs=False)
    count = 4 if quick else 12
    results = {}
    try:
        for mode, max_batch, loras in SETTINGS:
            results[f"{mode}_{loras}"] = _setting(root, case, max_batch, loras, count)
    finally:
        store.clear_cache()
    return _summary(results)


def _summary(results: dict) -> dict:
    batched = results["batched_one"]
    return {"settings": results,
            "serving_batched_vs_serial": batched["throughput"] / results["serial_one"]["throughput"],
            "serving_mixed_lora_vs_serial": results["batched_four"]["throughput"]
            / results["serial_four"]["throughput"],
            "serving_first_step_s": batched["first_step_mid_run_s"], "serving_step_s": batched["step_s"]}


def _setting(root: str, case, max_batch: int, loras: str, count: int) -> dict:
    config = ServerConfig(port=0, models_root=root, output_dir=os.path.join(root, "output"),
                          input_dir=os.path.join(root, "input"), temp_dir=os.path.join(root, "temp"),
                          state_dir=os.path.join(root, f"state-{max_batch}-{loras}"), max_batch=max_batch)
    server = BackgroundServer(config).start()
    try:
        prompts = [_prompt(case, i, loras) for i in range(count)]
        asyncio.run(_load(server.url, prompts[:1], concurrency=1, rate=None))  # warm-up: load, first bind
        records = asyncio.run(_load(server.url, prompts, concurrency=CONCURRENCY, rate=REQUEST_RATE))
    finally:
        server.stop()
    return _figures(records)


def _prompt(case, index: int, loras: str) -> dict:
    with open(WORKFLOW) as fh:
        prompt = json.load(fh)
    lora = LORA_A if loras == "one" else STYLES[index % len(STYLES)]
    for node in prompt.values():
        inputs = node["inputs"]
        kind = node["class_type"]
        if kind == "LoraBindModelLoader":
            inputs.update(model_name=MODEL_NAME, dtype="bfloat16")
        elif kind == "LoraBindEmptyLatent":
            inputs.update(width=case.width, height=case.height, frames=case.frames)
        elif kind == "LoraBindSampler":
            inputs.update(steps=4, cfg=1.0, shift=5.0, seed=1000 + index)
        elif kind == "FuseDistillLoRA":
            inputs.update(lora_name=lora, strength=1.0)
        elif kind == "LoraBindSaveImage":
            inputs.update(filename_prefix=f"bench-serving/{loras}")
    first_text = next(n for n in prompt.values() if n["class_type"] == "LoraBindTextEncode")
    first_text["inputs"]["text"] = f"prompt {index}: a cat dancing on a street, video"
    return prompt


async def _load(url: str, prompts: list, concurrency: int, rate) -> list:
    """Send ``prompts`` with Poisson arrivals at ``rate`` per second (None: all at once), at most ``concurrency``
    in flight; each prompt's (sent, first step, done, step times, others in flight when sent)."""
    arrivals, clock = [], 0.0
    draw = random.Random(0)
    for _ in prompts:
        arrivals.append(clock)
        clock += draw.expovariate(rate) if rate else 0.0
    slots = asyncio.Semaphore(concurrency)
    in_flight = [0]
    start = time.perf_counter()

    async def one(index: int, prompt: dict) -> dict:
        await asyncio.sleep(max(0.0, start + arrivals[index] - time.perf_counter()))
        async with slots:
            in_flight[0] += 1
            try:
                return await _one(url, f"bench-{index}", prompt, in_flight[0] - 1)
            finally:
                in_flight[0] -= 1

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


async def _one(url: str, client_id: str, prompt: dict, others: int) -> dict:
    async with aiohttp.ClientSession() as session, session.ws_connect(f"{url}/ws?clientId={client_id}") as ws:
        sent = time.perf_counter()
        async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": client_id}) as response:
            body = await response.json()
            if response.status != 200:
                raise RuntimeError(f"serving bench: /prompt answered {response.status}: {body}")
        steps = []
        while True:
            frame = await ws.receive(timeout=1800)
            if frame.type == aiohttp.WSMsgType.BINARY:  # a live preview (serve's default): not counted here
                continue
            if frame.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"serving bench: the WebSocket closed mid-prompt ({frame.type.name})")
            message = json.loads(frame.data)
            data = message.get("data", {})
            if data.get("prompt_id") != body["prompt_id"]:
                continue
            if message["type"] == "progress":
                steps.append(time.perf_counter())
            elif message["type"] == "execution_error":
                raise RuntimeError(f"serving bench: a prompt failed: {data.get('exception_message')}")
            elif message["type"] == "executing" and data.get("node") is None:
                return {"sent": sent, "steps": steps, "done": time.perf_counter(), "others": others}


def _figures(records: list) -> dict:
    latencies = sorted(r["done"] - r["sent"] for r in records)
    first = [r["steps"][0] - r["sent"] for r in records if r["steps"]]
    mid_run = [r["steps"][0] - r["sent"] for r in records if r["steps"] and r["others"]]
    gaps = [b - a for r in records for a, b in zip(r["steps"], r["steps"][1:])]
    span = max(r["done"] for r in records) - min(r["sent"] for r in records)
    return {"prompts": len(records), "throughput": len(records) / span, "latency_mean_s": statistics.fmean(latencies),
            "latency_p50_s": _quantile(latencies, 0.5), "latency_p99_s": _quantile(latencies, 0.99),
            "first_step_s": statistics.median(first), "first_step_mid_run_s": statistics.median(mid_run or first),
            "step_s": statistics.median(gaps) if gaps else 0.0}


def _quantile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def print_report(result: dict, print_table) -> None:
    rows = [("setting", "prompts/s", "latency mean / p50 / p99 s", "first step s (mid-run)", "step s")]
    for name, figures in result["settings"].items():
        rows.append((name, f"{figures['throughput']:.3f}",
                     f"{figures['latency_mean_s']:.2f} / {figures['latency_p50_s']:.2f} / "
                     f"{figures['latency_p99_s']:.2f}",
                     f"{figures['first_step_s']:.2f} ({figures['first_step_mid_run_s']:.2f})",
                     f"{figures['step_s']:.3f}"))
    print_table(f"Serving: {CONCURRENCY} clients at once, Poisson arrivals at {REQUEST_RATE:g}/s, "
                "--max-batch 1 vs 4 (one binding; four LoRAs over the prompts)", rows)


if __name__ == "__main__":
    import argparse
    import json
    import tempfile

    from .measure import print_table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorabind-bench-serving-") as tmp:
        outcome = run(tmp, args.quick)
    print_report(outcome, print_table)
    print(json.dumps({k: v for k, v in outcome.items() if k != "settings"}, indent=2))
