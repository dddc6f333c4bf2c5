"""Affinity routing vs round-robin on a Ray Serve pool (``lorabind serve --ray``), on one stream of prompts.

    python bench/scale_out.py [--prompts 12] [--sets 3] [--replicas 2] [--json FILE]

Both runs start a local Ray cluster with the same replicas and queue the same prompts at once: the tiny Wan2.2
lightx2v pair, the LoRA set named by the high-noise strength, cycling A, B, C, A, B, C… Affinity routes each
prompt by its binding fingerprint (Ray Serve model multiplexing); round-robin pins prompt i to replica
i mod N. Reported: fuses (binds that rewrote weights), prompts lost (must be 0) and wall time of each.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `lorabind` importable from this checkout's parent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "workflows" / "api" / "wan22_lightx2v_4step.api.json"
STRENGTHS = (1.0, 0.5, 0.25, 0.75, 0.125)


def _prompts(count: int, sets: int) -> list[dict]:
    base = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    prompts = []
    for i in range(count):
        prompt = copy.deepcopy(base)
        for node in prompt.values():
            if node["class_type"] == "WanMoELoRAPair":
                node["inputs"]["high_noise_strength"] = STRENGTHS[i % sets]
            if node["class_type"] == "LoraBindSampler":
                node["inputs"]["seed"] = i  # every prompt really samples (no cached outputs)
        prompts.append(prompt)
    return prompts


async def _run_stream(url: str, prompts: list[dict]) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/ws?clientId=bench") as ws:
            pending = set()
            for prompt in prompts:
                async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": "bench"}) as resp:
                    pending.add((await resp.json())["prompt_id"])
            queued = set(pending)
            while pending:
                frame = await ws.receive(timeout=600)
                if frame.type == aiohttp.WSMsgType.BINARY:  # a live preview
                    continue
                message = json.loads(frame.data)
                data = message.get("data", {})
                if message["type"] == "executing" and data.get("node") is None:
                    pending.discard(data.get("prompt_id"))
        async with session.get(f"{url}/history") as resp:
            history = await resp.json()
        async with session.get(f"{url}/lorabind/routing") as resp:
            routing = await resp.json()
    succeeded = sum(1 for pid in queued if history.get(pid, {}).get("status", {}).get("status_str") == "success")
    return {"prompts_lost": len(queued) - succeeded, "routing": routing}


def run_mode(routing: str, prompts: list[dict], replicas: int, root: Path) -> dict:
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.in_process_server import BackgroundServer

    out = root / f"out-{routing}"
    config = ServerConfig(port=0, models_root=str(root / "models"), output_dir=str(out / "output"),
                          input_dir=str(out / "input"), temp_dir=str(out / "temp"), ray_address="local",
                          replicas=replicas, routing=routing)
    server = BackgroundServer(config).start(timeout=300)
    try:
        start = time.perf_counter()
        result = asyncio.run(_run_stream(server.url, prompts))
        wall = time.perf_counter() - start
    finally:
        server.stop(timeout=120)
    replicas_state = result["routing"]["replicas"]
    return {"fuses": sum(r["fuses"] for r in replicas_state.values()), "prompts_lost": result["prompts_lost"],
            "wall_s": round(wall, 2), "per_replica": {k.rsplit("#", 1)[-1]: v for k, v in replicas_state.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--sets", type=int, default=3, choices=range(1, len(STRENGTHS) + 1))
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON ('-' for stdout)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lorabind.tiny_models import build_tiny, lora_fixtures

    with tempfile.TemporaryDirectory(prefix="lorabind-scale-out-") as tmp:
        root = Path(tmp)
        build_tiny(root / "models", names=["tiny-wan22-t2v"])
        lora_fixtures.write_fixture_loras(root / "models")
        prompts = _prompts(args.prompts, args.sets)
        affinity = run_mode("affinity", prompts, args.replicas, root)
        round_robin = run_mode("round_robin", prompts, args.replicas, root)
    figures = {"prompts": args.prompts, "lora_sets": args.sets, "replicas": args.replicas,
               "fuses_affinity": affinity["fuses"], "fuses_round_robin": round_robin["fuses"],
               "prompts_lost": affinity["prompts_lost"] + round_robin["prompts_lost"],
               "wall_s_affinity": affinity["wall_s"], "wall_s_round_robin": round_robin["wall_s"],
               "per_replica_affinity": affinity["per_replica"], "per_replica_round_robin": round_robin["per_replica"]}
    print(f"\n{args.prompts} prompts over {args.sets} LoRA sets, {args.replicas} replicas")
    print(f"  {'':12}{'affinity':>12}{'round-robin':>14}")
    print(f"  {'fuses':12}{affinity['fuses']:>12}{round_robin['fuses']:>14}")
    print(f"  {'lost':12}{affinity['prompts_lost']:>12}{round_robin['prompts_lost']:>14}")
    print(f"  {'wall (s)':12}{affinity['wall_s']:>12}{round_robin['wall_s']:>14}")
    if args.json:
        text = json.dumps(figures, indent=2)
        print(text) if args.json == "-" else Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0 if figures["prompts_lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
