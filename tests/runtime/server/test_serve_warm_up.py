"""``lorabind serve`` listens first (issue 45): on a fresh state folder it answers ``/system_stats`` within 10 s
of starting while the examples' tiny models are still being built, and a prompt that names one of them is queued
once it is built (it waits; it is not refused)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lorabind.runtime.server.config import PACK_DIR

FIRST_ANSWER_S = 10.0
MAIN_EXAMPLE = PACK_DIR / "workflows" / "api" / "wan22_lightx2v_4step.api.json"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.status, json.load(reply)


def _post(url: str, body: dict, timeout: float):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.mark.slow
def test_a_first_serve_answers_at_once_and_queues_a_prompt_whose_model_is_still_being_built(tmp_path):
    port, models = _free_port(), tmp_path / "models"
    package_parent = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "lorabind.runtime.cli", "serve", "--port", str(port),
                             "--models", str(models), "--output", str(tmp_path / "out")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        answer = None
        while answer is None and time.monotonic() - started < FIRST_ANSWER_S:
            try:
                answer = _get(f"http://127.0.0.1:{port}/system_stats")
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        answered_after = time.monotonic() - started
        built_by_then = (models / "diffusers" / "tiny-wan22-t2v" / "model_index.json").is_file()
        assert answer is not None and answer[0] == 200, f"no answer within {FIRST_ANSWER_S} s"
        assert "system" in answer[1]
        assert not built_by_then, f"the models were built before the first answer ({answered_after:.1f} s)"

        prompt = json.loads(MAIN_EXAMPLE.read_text(encoding="utf-8"))
        status, reply = _post(f"http://127.0.0.1:{port}/prompt", {"prompt": prompt}, timeout=600)
        assert status == 200 and reply["node_errors"] == {}, reply
        assert (models / "diffusers" / "tiny-wan22-t2v" / "model_index.json").is_file()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    assert "examples: building the built-in" in out, out


@pytest.mark.slow  # builds a tiny model
def test_the_warm_up_keeps_the_servers_folders_then_starts_the_worker_and_says_ready(tmp_path, caplog):
    """The warm-up runs after ServerState rooted the folders (output, --allow-lora-dir): it must not re-root
    them, or the worker would write the user's outputs into ./output."""
    import asyncio
    import shutil

    from aiohttp import web

    from lorabind.runtime import folder_paths
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.app import create_app
    from lorabind.runtime.server.comfy_api.example_warm_up import warm_up_in_background
    from lorabind.runtime.server.composition_root import STATE_KEY

    served = tmp_path / "workflows"
    served.mkdir()
    shutil.copy(MAIN_EXAMPLE, served)
    config = ServerConfig(port=0, models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "out"),
                          input_dir=str(tmp_path / "in"), temp_dir=str(tmp_path / "temp"), workflows_dir=str(served))
    app = create_app(config)
    warm_up_in_background(app, config, render_thumbnails=False)
    state = app[STATE_KEY]
    caplog.set_level("INFO", logger="lorabind.server")

    async def start_and_wait() -> None:
        runner = web.AppRunner(app)
        await runner.setup()  # on_startup: the worker is left to the warm-up
        try:
            for _ in range(1200):
                if any(r.getMessage().startswith("ready") for r in caplog.records):
                    return
                await asyncio.sleep(0.1)
        finally:
            await runner.cleanup()

    assert not state.models_built.is_set()
    asyncio.run(start_and_wait())
    assert state.models_built.is_set() and (tmp_path / "models" / "diffusers" / "tiny-wan22-t2v").is_dir()
    assert folder_paths.get_output_directory() == str((tmp_path / "out").resolve())
    assert any(r.getMessage().startswith("ready") for r in caplog.records)
