"""Shared by the ``--max-batch`` server tests (one process and Ray replicas): the main example as a prompt with
lossless PNG frames and an optional style LoRA per expert, the style files, and a prompt run through a client to
its frames and the sampler's report."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

import lorabind
from engine_helpers import style_lora

EXAMPLE = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_lightx2v_4step.api.json"
STYLE_NAMES = {seed: tuple(f"styles/s{seed}_{c}.safetensors" for c in ("transformer", "transformer_2"))
               for seed in (51, 61)}


def write_styles(models_root: Path) -> None:
    """The two style LoRAs (one file per expert each) under ``models_root/loras/styles``."""
    for seed, names in STYLE_NAMES.items():
        for offset, (name, component) in enumerate(zip(names, ("transformer", "transformer_2"))):
            style_lora(models_root / "diffusers" / "tiny-wan22-t2v", component, seed + offset,
                       models_root / "loras" / name)


def styled_prompt(seed: int, text: str, style: int | None = None, frames: int = 5) -> dict:
    """The main example with PNG frames (core SaveImage: lossless) and, with ``style``, a style LoRA per expert
    fused after the distill pair (what a user's own LoRA node adds)."""
    prompt = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    prompt["6"]["inputs"]["seed"] = seed
    prompt["2"]["inputs"]["text"] = text
    prompt["4"]["inputs"]["frames"] = frames
    prompt["8"] = {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": f"b{seed}"}}
    if style is not None:
        upstream = ["5", 0]
        for index, (name, component) in enumerate(zip(STYLE_NAMES[style], ("transformer", "transformer_2"))):
            prompt[f"{90 + index}"] = {"class_type": "FuseDistillLoRA", "inputs": {
                "model": copy.deepcopy(upstream), "lora_name": name, "strength": 0.8, "component": component}}
            upstream = [f"{90 + index}", 0]
        prompt["6"]["inputs"]["model"] = upstream
    return prompt


async def frames_of(client, prompt: dict) -> tuple:
    """(frames as one int16 array, the sampler's report, the messages of the prompt); (None, None, messages)
    when it did not succeed."""
    pid = (await client.queue_prompt(prompt))["prompt_id"]
    seen = await client.wait_done(pid, timeout=600)
    _, history = await client.get(f"/history/{pid}")
    entry = history[pid]
    if entry["status"]["status_str"] != "success":
        return None, None, seen
    images = [image for out in entry["outputs"].values() for image in out.get("images", [])]
    frames = []
    for image in images:
        _, data = await client.get("/view", params=image)
        frames.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16))
    report = next(out["lorabind_schedule"][0] for out in entry["outputs"].values() if "lorabind_schedule" in out)
    return np.stack(frames), report, seen
