"""``lorabind models download`` against a Hugging Face-compatible hub on loopback (issue 55): tiny files under the
real published names, reached through ``HF_ENDPOINT`` by huggingface_hub, no network.

What the user is promised: exactly the files ``plan`` names (three of its answers), in ComfyUI's folders; a killed
download resumes where it stopped; a corrupted byte never reaches the final name; a full disk, a gated and a
missing repository are refused in one line before the first byte; a second run fetches nothing; ``models check``
passes afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lorabind
from fake_hub import FakeHub
from lorabind.loaders.placement.choices import Machine, rank_choices
from lorabind.loaders.placement.storages import decode_size
from lorabind.runtime import cli, folder_paths
from lorabind.runtime.cli import main
from lorabind.usecases import model_downloads
from published_tiny import published_hub_files, served_bytes

WORKFLOWS = Path(lorabind.__file__).parent / "workflows"
WAN22_FP8 = ["diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
             "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
             "text_encoders/umt5_xxl_fp16.safetensors", "vae/wan_2.1_vae.safetensors"]  # plan pairs the bf16 encoder


@pytest.fixture(scope="module")
def repos(tiny_models_root):
    return published_hub_files(tiny_models_root)


@pytest.fixture
def hub(repos, monkeypatch):
    """A fresh fake hub as HF_ENDPOINT; the user's environment has not switched the hub off."""
    server = FakeHub(repos).start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setattr(cli, "_USERS_HUB_OFFLINE", [False])
    yield server
    server.stop()


def _download(*argv) -> int:
    try:
        return main(["models", "download", *argv])
    finally:
        folder_paths.configure()


def _files_under(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and ".lorabind-downloads" not in p.parts)


def _plan_files(model: str, weights=None, **memory) -> list:
    """The files of plan's first answer for ``model`` on a machine of ``memory`` (``vram_gib``, ``ram_gib``), at the
    model's own decode size, as ``lorabind plan`` asks."""
    decode, source = decode_size(model, None, None)
    return sorted(rank_choices(model, Machine(vram_gib=memory["vram_gib"], ram_gib=memory["ram_gib"], decode=decode,
                                              decode_source=source), weights=weights).fitting[0].files)


@pytest.mark.parametrize("model, argv, expected", [
    ("wan2.2-t2v-a14b", ["--weights", "fp8"], WAN22_FP8),
    ("wan2.2-t2v-a14b", ["--weights", "q4_k"],
     ["diffusion_models/Wan2.2-T2V-A14B-HighNoise-Q4_K_M.gguf", "diffusion_models/Wan2.2-T2V-A14B-LowNoise-Q4_K_M.gguf",
      "text_encoders/umt5_xxl_fp16.safetensors", "vae/wan_2.1_vae.safetensors"]),
    ("qwen-image", ["--vram", "16", "--ram", "32"],
     ["diffusion_models/qwen-image-Q4_0.gguf", "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
      "vae/qwen_image_vae.safetensors"]),
], ids=["wan22-fp8", "wan22-q4_k", "qwen-image-16gib"])
def test_a_plan_answer_downloads_exactly_its_files_into_the_comfyui_folders(hub, repos, tmp_path, model, argv,
                                                                           expected, capsys):
    weights = argv[1] if argv[0] == "--weights" else None
    machine = {"vram_gib": 16.0, "ram_gib": 32.0} if weights is None else {"vram_gib": 1024.0, "ram_gib": None}
    assert _plan_files(model, weights=weights, **machine) == expected  # what `plan` names for that answer
    assert _download(model, *argv, "--models", str(tmp_path)) == 0
    assert _files_under(tmp_path) == expected
    for destination in expected:
        assert (tmp_path / destination).read_bytes() == served_bytes(repos, destination)
    out = capsys.readouterr().out
    assert f"{len(expected)} downloaded, 0 already present" in out


def test_plan_json_answer_and_the_repository_id_name_the_same_files(hub, tmp_path, capsys):
    assert main(["plan", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--vram", "24", "--ram", "64", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["model"] == "wan2.2-t2v-a14b" and answer["choices"][0]["weights"] == "fp8"
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(answer))
    assert _download("--plan-json", str(saved), "--models", str(tmp_path / "models"), "--dry-run") == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("get ")]
    assert [line.split("-> models/")[1] for line in lines] == sorted(answer["choices"][0]["files"],
                                                                  key=[*answer["choices"][0]["files"]].index)
    assert "Comfy-Org/Wan_2.2_ComfyUI_Repackaged  split_files/diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled" \
           ".safetensors  0.00 GB  -> models/diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors" in out
    assert not (tmp_path / "models").exists() and hub.gets("") == []  # --dry-run fetched nothing


def test_a_second_run_downloads_nothing_and_models_check_passes_afterwards(hub, tmp_path, capsys):
    workflow = WORKFLOWS / "real" / "wan22_t2v_a14b_lightx2v.json"
    assert main(["models", "check", str(workflow), "--models", str(tmp_path)]) == 1
    assert _download(str(workflow), "--models", str(tmp_path)) == 0
    assert "6 downloaded, 0 already present" in capsys.readouterr().out
    fetched = len(hub.gets(""))
    assert fetched == 6
    assert _download(str(workflow), "--models", str(tmp_path)) == 0
    assert "0 downloaded, 6 already present" in capsys.readouterr().out
    assert len(hub.gets("")) == fetched  # not one GET more
    try:
        assert main(["models", "check", str(workflow), "--models", str(tmp_path)]) == 0
    finally:
        folder_paths.configure()
    assert "6 found, 0 missing" in capsys.readouterr().out


def test_a_download_killed_half_way_resumes_where_it_stopped(hub, tmp_path):
    """The hub's reader hands over 10 MiB chunks, so the file stalled half-way is a 24 MiB one: the killed run
    leaves its first chunk in the partial file and the next run asks for the rest with a Range request."""
    vae, repo, path = "vae/wan_2.1_vae.safetensors", "Comfy-Org/Wan_2.1_ComfyUI_repackaged", "split_files/vae/wan_2.1_vae.safetensors"
    whole = os.urandom(24 << 20)
    hub.files = {**hub.files, repo: {**hub.files[repo], path: whole}}
    hub.stall_after[(repo, path)] = len(whole) // 2
    env = {**os.environ, "HF_ENDPOINT": hub.url, "PYTHONPATH": str(Path(lorabind.__file__).parents[1])}
    for name in cli.HUB_OFFLINE_SWITCHES:
        env.pop(name, None)
    child = subprocess.Popen([sys.executable, "-m", "lorabind", "models", "download", "wan2.2-t2v-a14b", "--weights",
                              "fp8", "--models", str(tmp_path)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    partial = tmp_path / ".lorabind-downloads" / (vae + ".part")
    deadline = time.monotonic() + 120
    while not (partial.is_file() and partial.stat().st_size > 0):
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()[0].decode()[-2000:]
        time.sleep(0.05)
    child.kill()
    child.wait(30)
    kept = partial.stat().st_size
    assert 0 < kept <= len(whole) // 2 and not (tmp_path / vae).exists()  # part of a file never has the final name

    hub.stall_after.clear()
    assert _download("wan2.2-t2v-a14b", "--weights", "fp8", "--models", str(tmp_path)) == 0
    assert (tmp_path / vae).read_bytes() == whole and not partial.exists()
    assert hub.gets(path) == [None, f"bytes={kept}-"]  # the second run asked only for the rest


def test_a_corrupted_byte_is_refused_and_nothing_lands_under_the_final_name(hub, tmp_path, capsys):
    vae = "vae/wan_2.1_vae.safetensors"
    hub.corrupt.add(("Comfy-Org/Wan_2.1_ComfyUI_repackaged", "split_files/" + vae))
    assert _download("wan2.2-t2v-a14b", "--weights", "fp8", "--models", str(tmp_path)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vae/wan_2.1_vae.safetensors: sha256 " in err[0] and "is not the published" in err[0]
    assert not (tmp_path / vae).exists()
    assert not (tmp_path / ".lorabind-downloads" / (vae + ".part")).exists()


def test_too_little_disk_space_is_refused_before_the_first_byte(hub, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(model_downloads, "free_bytes", lambda root: 1000)
    assert _download("wan2.2-t2v-a14b", "--weights", "fp8", "--models", str(tmp_path)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not enough disk space" in err[0] and "4 file(s) need" in err[0]
    assert "0.0 GB free" in err[0]
    assert hub.gets("") == [] and _files_under(tmp_path) == []


@pytest.mark.parametrize("refusal, words", [("gated", "Comfy-Org/Wan_2.1_ComfyUI_repackaged: gated repository: "
                                                      "accept its conditions at https://huggingface.co/Comfy-Org/"
                                                      "Wan_2.1_ComfyUI_repackaged and set HF_TOKEN"),
                                            ("missing", "Comfy-Org/Wan_2.1_ComfyUI_repackaged: repository not found")])
def test_a_gated_or_missing_repository_is_one_line(hub, tmp_path, capsys, refusal, words):
    getattr(hub, refusal).add("Comfy-Org/Wan_2.1_ComfyUI_repackaged")
    assert _download("wan2.2-t2v-a14b", "--weights", "fp8", "--models", str(tmp_path)) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and words in captured.err, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert hub.gets("") == [] and _files_under(tmp_path) == []


def test_the_users_own_offline_switch_refuses_the_download(hub, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_USERS_HUB_OFFLINE", [True])
    assert _download("wan2.2-t2v-a14b", "--weights", "fp8", "--models", str(tmp_path)) == 1
    assert "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set in your environment" in capsys.readouterr().err
    assert hub.requests == []


def test_a_model_needs_a_choice_and_an_unknown_one_is_named(hub, tmp_path, capsys):
    assert _download("wan2.2-t2v-a14b", "--models", str(tmp_path)) == 1
    assert "say which files: --weights W" in capsys.readouterr().err
    assert _download("someone/some-model", "--weights", "fp8", "--models", str(tmp_path)) == 1
    assert "someone/some-model: not a model lorabind knows the files of" in capsys.readouterr().err
    assert hub.requests == []


@pytest.mark.slow  # runs the workflow (on the tiny stand-ins)
def test_run_download_fetches_the_missing_files_then_runs(hub, tmp_path, capsys):
    workflow = WORKFLOWS / "real" / "wan22_t2v_a14b_lightx2v.json"
    small = ["--set", "4.width=32", "--set", "4.height=32", "--set", "4.frames=5"]
    try:
        code = main(["run", str(workflow), "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"),
                     "--download", *small])
    finally:
        folder_paths.configure()
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "6 downloaded, 0 already present" in out and len(hub.gets("")) == 6
    assert list((tmp_path / "out" / "lorabind").glob("wan22_t2v_a14b_lightx2v_*.webp"))
