"""Every committed workflow gives bit-identical output data in ``lorabind run`` and ``lorabind serve``.

The guard for refactors that must not change a single sample (issue #10 and everything built on it): the
sha256 of each output's DATA (decoded image frames as raw RGB bytes, WAV sample data) was recorded once in
``workflow_output_hashes.json`` before the refactor and is compared here. Container bytes are not hashed on
purpose: the embedded prompt/workflow metadata may legitimately change. The workflow whose contract is
mismatched by design must fail the same way in both paths instead.

To re-record after an intended numerical change: ``LORABIND_RECORD_OUTPUT_HASHES=1 pytest <this file>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image, ImageSequence

import lorabind
from lorabind.runtime.cli import main

WORKFLOWS = Path(lorabind.__file__).parent / "workflows"
HASHES_FILE = Path(__file__).with_name("workflow_output_hashes.json")
RECORD = os.environ.get("LORABIND_RECORD_OUTPUT_HASHES") == "1"
NAMES = sorted(path.name[: -len(".api.json")] for path in WORKFLOWS.glob("*.api.json"))
# Refused by design: a 4-step distill pair sampled with 20 steps.
FAILING = {"wan22_mismatched_contract": "is a 4-step distill LoRA: steps must be 4, got 20"}


def data_hash(path: Path) -> str:
    """sha256 of an output's data: every frame's RGB bytes (images) or the ``data`` chunk (WAV)."""
    digest = hashlib.sha256()
    if path.suffix == ".wav":
        blob = path.read_bytes()
        pos = 12
        while pos + 8 <= len(blob):
            tag, size = blob[pos:pos + 4], struct.unpack("<I", blob[pos + 4:pos + 8])[0]
            if tag in (b"fmt ", b"data"):
                digest.update(tag + blob[pos + 8:pos + 8 + size])
            pos += 8 + size + (size % 2)
        return digest.hexdigest()
    with Image.open(path) as image:
        for frame in ImageSequence.Iterator(image):
            rgb = frame.convert("RGB")
            digest.update(struct.pack("<II", *rgb.size) + rgb.tobytes())
    return digest.hexdigest()


def hashes_of(output_dir: Path) -> dict[str, str]:
    """{relative output path: data hash} of every image/audio file written under ``output_dir``."""
    return {path.relative_to(output_dir).as_posix(): data_hash(path)
            for path in sorted(output_dir.rglob("*")) if path.suffix in (".png", ".webp", ".wav")}


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    """One models root with every built-in tiny model and fixture LoRA, shared by run and serve."""
    from lorabind.loaders.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("hash_models")
    build_tiny(root)
    return root


@pytest.fixture(scope="module")
def expected():
    if RECORD:
        recorded: dict = {}
        yield recorded
        HASHES_FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    yield json.loads(HASHES_FILE.read_text())


@pytest.fixture(scope="module")
def server(models_root, tmp_path_factory):
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.in_process_server import BackgroundServer

    out = tmp_path_factory.mktemp("hash_serve")
    config = ServerConfig(port=0, models_root=str(models_root), output_dir=str(out / "output"),
                          input_dir=str(out / "input"), temp_dir=str(out / "temp"))
    srv = BackgroundServer(config).start()
    yield srv, out / "output"
    srv.stop()


def test_every_workflow_is_covered(expected):
    if not RECORD:
        assert sorted(expected) == [name for name in NAMES if name not in FAILING]


@pytest.mark.parametrize("name", NAMES)
def test_run_output_data_is_unchanged(name, models_root, expected, tmp_path, capsys):
    out = tmp_path / "output"
    code = main(["run", str(WORKFLOWS / f"{name}.api.json"), "--models", str(models_root), "--output", str(out),
                 "--input", str(tmp_path / "input")])
    captured = capsys.readouterr()
    if name in FAILING:
        assert code == 1 and FAILING[name] in captured.err
        assert not out.exists() or hashes_of(out) == {}
        return
    assert code == 0, captured.err
    got = hashes_of(out)
    if RECORD:
        expected[name] = got
    assert got and got == expected[name]


def serve_prompt(url: str, prompt: dict, timeout: float = 300.0) -> dict:
    """POST one prompt to a running ``lorabind serve`` and return its finished history entry."""
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(urllib.request.Request(
            f"{url}/prompt", data=json.dumps({"prompt": prompt}).encode(),
            headers={"Content-Type": "application/json"})) as response:
        prompt_id = json.load(response)["prompt_id"]
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/history/{prompt_id}") as response:
            history = json.load(response)
        if prompt_id in history:
            return history[prompt_id]
        time.sleep(0.05)
    raise AssertionError(f"prompt {prompt_id} did not finish within {timeout} s")


@pytest.mark.parametrize("name", NAMES)
def test_serve_output_data_is_unchanged(name, server, expected):
    srv, output_dir = server
    entry = serve_prompt(srv.url, json.loads((WORKFLOWS / f"{name}.api.json").read_text(encoding="utf-8")))
    messages = dict(entry["status"]["messages"])
    if name in FAILING:
        assert entry["status"]["status_str"] == "error"
        assert FAILING[name] in messages["execution_error"]["exception_message"]
        return
    assert entry["status"]["status_str"] == "success", messages
    files = [item for output in entry["outputs"].values() for key in ("images", "audio")
             for item in output.get(key, [])]
    got = {f"{item['subfolder']}/{item['filename']}".lstrip("/"):
           data_hash(output_dir / item["subfolder"] / item["filename"]) for item in files}
    # while recording too: the run tests above have just recorded, and serve must agree with them
    assert got and got == expected[name]
