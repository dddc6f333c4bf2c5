"""``lorabind serve --openai-model REPO_ID`` (issue 55): a repository id serves that model's real-size workflow
(workflows/real/) when its files are under ``--models``; when they are not, serve exits with the one ``lorabind
models download`` command that gets them, and that command is enough; with ``--download`` serve fetches them
itself (the same code) from the hub ``HF_ENDPOINT`` names, then serves. The hub is a fake on loopback serving tiny
files under the real names (``fake_hub``, ``published_tiny``), so the served model is the tiny Wan2.2 and a video
request completes in seconds.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import lorabind
from fake_hub import FakeHub
from lorabind.runtime import cli, folder_paths
from lorabind.runtime.cli import main
from published_tiny import published_hub_files

REPO = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
WORKFLOW_FILES = {"diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                  "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
                  "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors", "vae/wan_2.1_vae.safetensors",
                  "loras/wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors",
                  "loras/wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors"}


@pytest.fixture(scope="module")
def repos(tiny_models_root):
    return published_hub_files(tiny_models_root)


def _files(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".lorabind-downloads" not in p.parts}


def test_missing_files_stop_serve_with_the_one_command_that_gets_them(repos, tmp_path, capsys, monkeypatch):
    models = tmp_path / "models"
    try:
        assert main(["serve", "--openai-model", REPO, "--models", str(models), "--port", "0"]) == 2
    finally:
        folder_paths.configure()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lorabind serve: --openai-model {REPO}: 6 model file(s) missing")
    command = lines[0].split("get them with: ", 1)[1].removesuffix(" (or add --download)")
    argv = shlex.split(command)
    assert argv[:3] == ["lorabind", "models", "download"] and argv[3].endswith("real/wan22_t2v_a14b_lightx2v.api.json")
    assert not models.exists()  # nothing was downloaded, nothing written

    with FakeHub(repos) as hub:  # the command it names gets exactly what serving needs
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(cli, "_USERS_HUB_OFFLINE", [False])
        try:
            assert main(argv[1:]) == 0
        finally:
            folder_paths.configure()
    assert _files(models) == WORKFLOW_FILES


def test_an_unknown_repository_id_names_the_ones_served(tmp_path, capsys):
    assert main(["serve", "--openai-model", "someone/some-model", "--models", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "--openai-model 'someone/some-model': expected NAME=WORKFLOW.api.json, or a repository id" in out
    assert REPO in out and "Qwen/Qwen-Image" in out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _request(url: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


@pytest.mark.slow  # a serve process, its warm-up and a video job
def test_download_fetches_the_files_and_serves_the_repository(repos, tmp_path):
    port, models = _free_port(), tmp_path / "models"
    env = {**os.environ, "PYTHONPATH": str(Path(lorabind.__file__).parents[1])}
    for name in cli.HUB_OFFLINE_SWITCHES:
        env.pop(name, None)
    with FakeHub(repos) as hub:
        env["HF_ENDPOINT"] = hub.url
        proc = subprocess.Popen([sys.executable, "-m", "lorabind", "serve", "--openai-model", REPO, "--download",
                                 "--models", str(models), "--port", str(port), "--output", str(tmp_path / "out"),
                                 "--input", str(tmp_path / "in"), "--temp", str(tmp_path / "temp")],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline, served = time.monotonic() + 300, None
            while served is None:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
                try:
                    served = _request(f"http://127.0.0.1:{port}/v1/models")
                except OSError:
                    time.sleep(0.2)
            assert [model["id"] for model in served["data"]] == [REPO]
            assert WORKFLOW_FILES <= _files(models)
            assert len(hub.gets("")) == 6
            job = _request(f"http://127.0.0.1:{port}/v1/videos",
                           {"model": REPO, "prompt": "a fox in the snow", "size": "32x32", "num_frames": 5, "seed": 3})
            while job["status"] not in ("completed", "failed"):
                assert time.monotonic() < deadline + 300, job
                time.sleep(0.5)
                job = _request(f"http://127.0.0.1:{port}/v1/videos/{job['id']}")
            assert job["status"] == "completed", job
        finally:
            proc.terminate()
            out = proc.communicate(timeout=60)[0]
    assert "6 downloaded, 0 already present" in out, out[-3000:]
