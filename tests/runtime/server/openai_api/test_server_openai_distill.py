"""``lorabind serve --lora-backend distill --lora-path HIGH LOW`` on the plain Wan2.2 template: the pair is fused
once at start (a warm-up prompt through the queue), requests then bind nothing new, and a per-request PEFT
adapter from an ``--allow-lora-dir`` folder runs on top without touching the fused pair. Whole workflows: slow.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW, _config, _save_peft_folder
from optional_extras import deferred, requires

openai = deferred("openai")
pytestmark = [requires("openai"), pytest.mark.slow]

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"


@pytest.fixture(scope="module")
def adapters(tiny_models_root, tmp_path_factory):
    """A user's PEFT adapter for the Wan2.2 experts, in a folder outside models/loras."""
    folder = tmp_path_factory.mktemp("user_adapters")
    _save_peft_folder(folder / "style", _config(Path(tiny_models_root) / "diffusers" / "tiny-wan22-t2v",
                                                "transformer"), seed=11)
    return folder


@pytest.fixture(scope="module")
def server(tiny_models_root, adapters, tmp_path_factory):
    from lorabind.loaders.models import store as model_store

    model_store.clear_cache()  # a fresh model: whatever earlier tests bound is not what the warm-up finds
    root = tmp_path_factory.mktemp("openai_distill")
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), state_dir=str(root / "state"),
                          openai_models=(("wan", str(WORKFLOWS / "wan22_tiny_t2v.api.json")),),
                          distill_loras=(WAN22_HIGH, WAN22_LOW), lora_dirs=(str(adapters),))
    srv = BackgroundServer(config).start(timeout=300)
    yield srv
    srv.stop()


def _bind_reports(server) -> dict:
    """{prompt id: the sampler's bind report} of every finished prompt, in the order they ran."""
    with urllib.request.urlopen(server.url + "/history") as reply:
        history = json.loads(reply.read())
    return {prompt_id: output["lorabind_schedule"][0]["bind"] for prompt_id, entry in history.items()
            for output in entry["outputs"].values() if "lorabind_schedule" in output}


def _wait_for_warm_up(server) -> dict:
    for _ in range(600):
        warm = {pid: bind for pid, bind in _bind_reports(server).items() if pid.startswith("warm-up-wan")}
        if warm:
            return next(iter(warm.values()))
        time.sleep(0.5)
    raise AssertionError("the warm-up prompt did not finish")


def test_the_pair_fuses_once_at_start_and_requests_fuse_nothing_more(server, adapters):
    warm_up = _wait_for_warm_up(server)
    assert [(f["name"], f["component"]) for f in warm_up["fuses"]] == [
        (WAN22_HIGH, "transformer"), (WAN22_LOW, "transformer_2")]  # high then low, as in the guide
    assert warm_up["written"] > 0
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300)
    for seed in (1, 2, 3):  # no steps or guidance sent: the defaults are what the pair declares (4 steps, cfg 1)
        client.chat.completions.create(model="wan", messages=[{"role": "user", "content": "a fox"}],
                                       extra_body={"seed": seed})
    client.chat.completions.create(model="wan", messages=[{"role": "user", "content": "a fox"}], extra_body={
        "seed": 4, "lora": {"name": "style", "path": str(adapters / "style"), "scale": 0.5}})
    client.chat.completions.create(model="wan", messages=[{"role": "user", "content": "a fox"}],
                                   extra_body={"seed": 5})
    requests = [bind for pid, bind in _bind_reports(server).items() if not pid.startswith("warm-up")]
    assert len(requests) == 5
    assert [(bind["written"], bind["restored"]) for bind in requests] == [(0, 0)] * 5  # the pair stays fused
    assert [len(bind["fuses"]) for bind in requests] == [2] * 5
    assert [[a["name"] for a in bind["adapters"]] for bind in requests] == [[], [], [], ["style"], []]
    with pytest.raises(openai.BadRequestError) as caught:  # the pair's contract holds on every request
        client.chat.completions.create(model="wan", messages=[{"role": "user", "content": "a fox"}],
                                       extra_body={"num_inference_steps": 8})
    assert caught.value.body["param"] == "num_inference_steps" and WAN22_HIGH.split("/")[-1] in \
        caught.value.body["message"]
