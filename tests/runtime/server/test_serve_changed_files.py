"""A model file that changes under a running ``lorabind serve`` (issues 52.3, 54.1, 61.2), against a real server
process (before the fix a truncated weight killed it with SIGBUS, which must fail this test, not the session):

* ``touch model_index.json``: the next prompt ran into a raw ``KeyError`` of a cache key holding the folder's
  absolute path; now the model is loaded afresh, with one line in the log;
* a same-size rewrite of the (unpatched) VAE in place: the next output changed silently; now it is noticed;
* a truncated VAE: the server died (exit 135); now the prompt is refused naming the file, the server keeps
  serving, and once the file is back the next prompt gives the first output again.
No message of any prompt carries a local path."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import lorabind
from hostile_files import rewrite_in_place
from server_client import Client, run_async

pytestmark = pytest.mark.slow  # a real server process and five prompts of the tiny Wan2.2 model

WORKFLOW = Path(lorabind.__file__).parent / "workflows" / "wan22_tiny_t2v.api.json"
PACKAGE_PARENT = str(Path(lorabind.__file__).resolve().parents[1])
VAE = Path("vae") / "diffusion_pytorch_model.safetensors"
RELOADED = "lorabind: tiny-wan22-t2v changed on disk since it was loaded; loading it afresh"


def _prompt(seed: int) -> dict:
    prompt = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    for node in prompt.values():
        if node["class_type"] == "LoraBindSampler":
            node["inputs"]["seed"] = seed
    return prompt


def _serve(tmp_path: Path, log) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen([sys.executable, "-m", "lorabind.runtime.cli", "serve", "--port", str(port),
                               "--models", str(tmp_path / "models"), "--output", str(tmp_path / "output")],
                              cwd=tmp_path, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/system_stats", timeout=1).close()
            return server, url
        except OSError:
            assert server.poll() is None, f"lorabind serve exited with {server.returncode}"
            time.sleep(0.2)
    raise AssertionError("lorabind serve did not answer within 300 s")


async def _run(client: Client, seed: int) -> tuple[str, str, bytes]:
    """(the prompt's end: execution_success / execution_error, its error message, its image's bytes)."""
    prompt_id = (await client.queue_prompt(_prompt(seed)))["prompt_id"]
    seen = await client.wait_done(prompt_id, timeout=300)
    end = seen[-2]
    message = end["data"].get("exception_message", "") if end["type"] == "execution_error" else ""
    _, history = await client.get(f"/history/{prompt_id}")
    images = [image for out in history[prompt_id]["outputs"].values() for image in out.get("images", [])]
    data = b""
    if images:
        _, data = await client.get("/view", params=images[0])
    return end["type"], message, data


def test_a_model_file_changed_under_serve_is_reloaded_or_refused_by_name_and_serving_goes_on(tmp_path):
    from lorabind.tiny_models import build_tiny

    build_tiny(tmp_path / "models", names=["tiny-wan22-t2v"])
    folder = tmp_path / "models" / "diffusers" / "tiny-wan22-t2v"
    original = (folder / VAE).read_bytes()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        server, url = _serve(tmp_path, log)

        async def body():
            client = Client(url)
            await client.connect()
            try:
                first = await _run(client, seed=7)
                os.utime(folder / "model_index.json")  # issue 54.1
                touched = await _run(client, seed=8)
                rewrite_in_place(folder / VAE)  # issue 61.2
                rewritten = await _run(client, seed=8)
                os.truncate(folder / VAE, len(original) // 2)  # issue 52.3
                truncated = await _run(client, seed=7)
                (folder / VAE).write_bytes(original)
                restored = await _run(client, seed=7)
                return first, touched, rewritten, truncated, restored
            finally:
                await client.close()

        try:
            first, touched, rewritten, truncated, restored = run_async(body)
            assert server.poll() is None  # still serving
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    lines = log_path.read_text().splitlines()
    assert first[0] == touched[0] == rewritten[0] == restored[0] == "execution_success", (first, touched, rewritten)
    assert rewritten[2] != touched[2]  # the rewritten VAE decodes the same latent differently: it was loaded
    assert truncated[0] == "execution_error"
    assert "tiny-wan22-t2v/vae/diffusion_pytorch_model.safetensors" in truncated[1]
    assert restored[2] == first[2]  # the original files again: the first output again
    assert lines.count(RELOADED) == 3, [line for line in lines if "changed on disk" in line]  # touch, rewrite, cut
    for _, message, _ in (first, touched, rewritten, truncated, restored):
        assert str(tmp_path) not in message and "KeyError" not in message
