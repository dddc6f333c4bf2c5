"""Two self-links under ``models/diffusers/`` do not hang the model list: not in the loader node, not in the
server's ``/object_info``, not in ``lorabind run`` (whose validation lists every node's choices).

Before the use-case layer, ``nodes/model_nodes.py:list_model_folders`` walked with ``followlinks=True`` and no
loop guard: each self-link multiplied the walk without end. Each host runs the one guarded walker now
(``usecases.model_folders.walk``); every check here runs with a deadline, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

DEADLINE_S = 60


@pytest.fixture
def looped_root(tmp_path) -> Path:
    """A models root whose ``diffusers`` folder holds one model and two links to itself."""
    diffusers = tmp_path / "models" / "diffusers"
    (diffusers / "mine").mkdir(parents=True)
    (diffusers / "mine" / "model_index.json").write_text("{}")
    (diffusers / "self_a").symlink_to(diffusers, target_is_directory=True)
    (diffusers / "self_b").symlink_to(diffusers, target_is_directory=True)
    return tmp_path / "models"


def _within_deadline(call):
    result, thread = [], threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the model list did not finish: the walk follows the self-links"
    return result[0]


def test_the_loader_node_lists_the_model_once(looped_root, registry_at):
    from lorabind.nodes.model_nodes import LoraBindModelLoader

    registry_at(looped_root)
    choices = _within_deadline(lambda: LoraBindModelLoader.INPUT_TYPES()["required"]["model_name"][0])
    assert "mine" in choices and "tiny-wan22-t2v" in choices
    assert not [c for c in choices if c.startswith(("self_a", "self_b"))]


@pytest.mark.slow
def test_the_server_object_info_answers(looped_root, tmp_path):
    from lorabind.nodes.model_nodes import LoraBindModelLoader
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.in_process_server import BackgroundServer
    from server_client import Client, run_async

    config = ServerConfig(listen="127.0.0.1", port=0, models_root=str(looped_root), output_dir=str(tmp_path / "o"),
                          input_dir=str(tmp_path / "i"), temp_dir=str(tmp_path / "t"))
    server = BackgroundServer(config, node_classes={"LoraBindModelLoader": LoraBindModelLoader}).start()

    async def body():
        client = Client(server.url)
        try:
            return await client.get("/object_info")
        finally:
            await client.close()

    try:
        status, info = _within_deadline(lambda: run_async(body))
    finally:
        server.stop()
    assert status == 200
    assert "mine" in info["LoraBindModelLoader"]["input"]["required"]["model_name"][0]


@pytest.mark.slow
def test_lorabind_run_validates_against_the_list(looped_root, tmp_path):
    prompt = {"1": {"class_type": "LoraBindModelLoader", "inputs": {"model_name": "not-there", "dtype": "auto"}},
              "2": {"class_type": "LoraBindSaveImage", "inputs": {"images": ["1", 0]}}}
    workflow = tmp_path / "prompt.api.json"
    workflow.write_text(json.dumps(prompt))
    done = subprocess.run([sys.executable, "-m", "lorabind.runtime.cli", "run", str(workflow), "--models",
                           str(looped_root), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode != 0
    assert "not-there" in done.stderr + done.stdout
