"""Issue 46's hostile files, asked of a running server by ``bench/load_test.py --hostile``: each must be refused
in under 1 s and under 100 MB above the server's resting RSS, while ``GET /queue`` stays under 1 s.

- a LoRA whose ``sampling_contract`` metadata declares 10^9 steps (a 10^9-point sigma table was built: 7.6 GB);
- a LoRA given 10^9 steps by a contract table line;
- a GGUF denoiser whose metadata holds one key, ``tokenizer.tokens``, of 999,999 empty strings (8 MB; the gguf
  package's reader took 45 s and 1.6 GB).
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
from pathlib import Path

import aiohttp

HUGE_STEPS = "steps=1000000000"
GGUF_STRINGS = 999_999
LOOKUPS = (("loras", "huge-steps-metadata.safetensors"), ("loras", "table-steps/huge-steps-table.safetensors"),
           ("diffusion_models", "gguf-empty-strings.gguf"))


def _safetensors(metadata: dict) -> bytes:
    """A one-tensor LoRA file, written by hand (the bench imports no torch)."""
    module = "diffusion_model.blocks.0.self_attn.q"
    header = {"__metadata__": metadata,
              f"{module}.lora_down.weight": {"dtype": "F32", "shape": [1, 1], "data_offsets": [0, 4]},
              f"{module}.lora_up.weight": {"dtype": "F32", "shape": [1, 1], "data_offsets": [4, 8]}}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 8


def _gguf_string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _gguf_with_empty_strings(count: int) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2)
    head += _gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string("wan")
    head += _gguf_string("tokenizer.tokens") + struct.pack("<IIQ", 9, 8, count) + struct.pack("<Q", 0) * count
    head += _gguf_string("blocks.0.ffn.2.weight") + struct.pack("<I2QIQ", 2, 4, 2, 0, 0)  # F32 [2, 4] at 0
    head += b"\0" * (-len(head) % 32)
    return head + struct.pack("<8f", *range(8))


def write_issue46_models(models: str) -> None:
    loras, denoisers = Path(models, "loras"), Path(models, "diffusion_models")
    (loras / "table-steps").mkdir(parents=True, exist_ok=True)
    denoisers.mkdir(parents=True, exist_ok=True)
    (loras / LOOKUPS[0][1]).write_bytes(_safetensors({"sampling_contract": HUGE_STEPS}))
    (loras / LOOKUPS[1][1]).write_bytes(_safetensors({}))
    (loras / "table-steps" / "lorabind-contracts.json").write_text(json.dumps({"huge-steps-*": HUGE_STEPS}))
    (denoisers / LOOKUPS[2][1]).write_bytes(_gguf_with_empty_strings(GGUF_STRINGS))


def _mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak(pid: int) -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5), so the peak read after a
    lookup is that lookup's."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


async def measure_issue46(url: str, pid: int, poll_queue) -> bool:
    """Ask each lookup once (fresh, uncached) while ``GET /queue`` is polled from another thread; print the
    figures; True when every goal holds."""
    done = threading.Event()
    polling = asyncio.ensure_future(asyncio.to_thread(poll_queue, url, done))
    ok, rows = True, []
    async with aiohttp.ClientSession() as session:
        await asyncio.sleep(0.3)
        for folder, name in LOOKUPS:
            resting, reset = _mib(pid, "VmRSS"), _reset_peak(pid)
            started = time.perf_counter()
            async with session.get(f"{url}/lorabind/contract", params={"name": name, "folder": folder}) as resp:
                status, reason = resp.status, (await resp.json()).get("reason") or ""
            seconds = time.perf_counter() - started
            above = _mib(pid, "VmHWM") - resting if reset else _mib(pid, "VmRSS") - resting
            ok = ok and status == 422 and seconds < 1.0 and above < 100
            rows.append(f"  {name}: {status} in {seconds * 1000:.0f} ms, peak +{above:.1f} MiB above resting "
                        f"{resting:.0f} MiB ({reason[:110]})")
        await asyncio.sleep(0.3)
    done.set()
    slowest = max(await polling)
    ok = ok and slowest < 1.0
    print("hostile files (issue 46), loopback:")
    print("\n".join(rows))
    print(f"  GET /queue meanwhile: slowest {slowest:.3f} s")
    print("  OK" if ok else "  FAILED: a figure is over its goal (refused, < 1 s, < 100 MiB, /queue < 1 s)")
    return ok
