"""Issue 52 item 3, asked of a running server by ``bench/load_test.py --hostile``: a weight file truncated under
``lorabind serve`` (``cp`` over a model file truncates it first). Before, the next touch of the weights still mapped
from the file killed the server with SIGBUS (exit 135), its queue and history with it. Goals: the server lives, the
prompt after the truncation is refused naming the file (relative to the models folder, no local path), and once
the file is back the next prompt succeeds with the first prompt's output.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import aiohttp

WORKFLOW = Path(__file__).resolve().parents[1] / "workflows" / "wan22_tiny_t2v.api.json"
MODEL = "tiny-wan22-t2v"
VAE = Path("vae") / "diffusion_pytorch_model.safetensors"
NAMED = f"{MODEL}/vae/diffusion_pytorch_model.safetensors"


def write_issue52_models(models: str) -> None:
    """The tiny Wan2.2 model the example workflow loads (built here: the bench's models root is temporary)."""
    from lorabind.tiny_models import build_tiny  # lazy: the bench's other cases import no torch

    build_tiny(Path(models), names=[MODEL])


async def _run(session: aiohttp.ClientSession, url: str, seed: int, timeout: float = 300.0) -> dict:
    """Queue the example with ``seed``; its status, error message, image name and seconds from its history."""
    prompt = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    for node in prompt.values():
        if node["class_type"] == "LoraBindSampler":
            node["inputs"]["seed"] = seed
    started = time.perf_counter()
    async with session.post(f"{url}/prompt", json={"prompt": prompt}) as resp:
        prompt_id = (await resp.json())["prompt_id"]
    while time.perf_counter() - started < timeout:
        async with session.get(f"{url}/history/{prompt_id}") as resp:
            entry = (await resp.json()).get(prompt_id)
        if entry is not None:
            errors = [data for kind, data in entry["status"].get("messages", []) if kind == "execution_error"]
            images = [i for out in entry["outputs"].values() for i in out.get("images", [])]
            image = b""
            if images:
                async with session.get(f"{url}/view", params=images[0]) as resp:
                    image = await resp.read()
            return {"status": entry["status"]["status_str"], "seconds": time.perf_counter() - started,
                    "message": errors[0].get("exception_message", "") if errors else "", "image": image}
        await asyncio.sleep(0.1)
    raise RuntimeError(f"prompt {prompt_id} did not finish within {timeout:.0f} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}/status").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


async def measure_issue52(url: str, pid: int, models: str) -> bool:
    """Run the example, truncate its VAE file, run it again, put the file back and run it once more; print the
    figures; True when every goal holds."""
    weights = Path(models, "diffusers", MODEL) / VAE
    original = weights.read_bytes()
    async with aiohttp.ClientSession() as session:
        first = await _run(session, url, seed=52)
        os.truncate(weights, len(original) // 2)
        try:
            cut = await _run(session, url, seed=52) if _alive(pid) else None
        finally:
            weights.write_bytes(original)
        alive = _alive(pid)
        after = await _run(session, url, seed=52) if alive else None
    print("a weight file truncated under serve (issue 52 item 3), loopback:")
    print(f"  first prompt: {first['status']} in {first['seconds']:.2f} s (loads the model)")
    if cut is None or not alive:
        print("  the server died")
        return False
    print(f"  after truncating {NAMED} to half: {cut['status']} in {cut['seconds']:.2f} s ({cut['message'][:160]})")
    print(f"  after putting it back: {after['status']} in {after['seconds']:.2f} s (loads the model again)")
    same = bool(first["image"]) and first["image"] == after["image"]
    print(f"  the output after it is back equals the first: {same}")
    ok = (first["status"] == "success" and cut["status"] == "error" and NAMED in cut["message"]
          and str(Path(models).resolve()) not in cut["message"] and after["status"] == "success" and same)
    print("  OK" if ok else "  FAILED: the server must live, refuse the prompt naming the file, then serve the first "
                            "output again")
    return ok

