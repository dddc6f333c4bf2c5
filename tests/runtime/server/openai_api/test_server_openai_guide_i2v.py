"""The guide's Wan2.2 I2V request (``--flow-shift 12 --sample-solver euler --guidance-scale 1.0
--guidance-scale-high 1.0 --boundary-ratio 0.875``, 4 steps) sent through the official ``openai`` client to
``lorabind serve --openai-model wan-i2v=workflows/api/wan22_i2v_lightx2v_4step.api.json``, whose template binds the
lightx2v ``_1022`` pair: it runs as sent, and a field the pair's contract refuses is a 400 naming the file and
the field. Whole workflows through the server's queue: slow.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from optional_extras import deferred, requires

openai = deferred("openai")
pytestmark = [requires("openai"), pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
HIGH = "wan2.2_i2v_A14b_high_noise_lora_rank64_lightx2v_4step_1022.safetensors"
TEMPLATE = "wan22_i2v_lightx2v_4step.api.json"
GUIDE_I2V = {"num_inference_steps": 4, "flow_shift": 12.0, "sample_solver": "euler", "guidance_scale": 1.0,
             "guidance_scale_high": 1.0, "boundary_ratio": 0.875, "seed": 42}


@pytest.fixture(scope="module")
def server(tiny_models_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("openai_i2v")
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), state_dir=str(root / "state"),
                          openai_models=(("wan-i2v", str(WORKFLOWS / TEMPLATE)),))
    srv = BackgroundServer(config).start(timeout=300)
    yield srv
    srv.stop()


def _ask(server, **fields):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300)
    return client.chat.completions.create(model="wan-i2v", extra_body=fields, messages=[
        {"role": "user", "content": "a yellow ball rolling across the frame"}])


def _last_schedule(server) -> dict:
    with urllib.request.urlopen(server.url + "/history?max_items=1") as reply:
        (entry,) = json.loads(reply.read()).values()
    return entry["outputs"]["7"]["lorabind_schedule"][0]


def test_the_guides_i2v_request_runs_when_it_agrees_with_the_pairs_contract(server):
    reply = _ask(server, **GUIDE_I2V)
    (content,) = reply.choices[0].message.content
    assert content["type"] == "video_url" and "/view?" in content["video_url"]["url"]
    schedule = _last_schedule(server)
    assert (schedule["steps"], schedule["shift"], schedule["cfg"], schedule["boundary"], schedule["scheduler"]) == (
        4, 12.0, 1.0, 0.875, "euler")
    assert [c["source"] for c in schedule["contracts"]][0] == HIGH


@pytest.mark.parametrize("change, field", [
    ({"guidance_scale_high": 3.5}, "guidance_scale_high"),  # the pair is distilled for cfg 1
    ({"guidance_scale": 3.5}, "guidance_scale"),  # next to guidance_scale_high: the low-noise expert's
    ({"sample_solver": "unipc"}, "sample_solver"),  # the pair is sampled with euler by its publisher
    ({"num_inference_steps": 8}, "num_inference_steps"),
])
def test_a_field_the_pairs_contract_refuses_is_a_400_naming_the_file_and_the_field(server, change, field):
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(server, **{**GUIDE_I2V, **change})
    error = caught.value.body
    assert (caught.value.status_code, error["param"], error["code"]) == (400, field, "contract_mismatch")
    assert HIGH in error["message"] and TEMPLATE in error["message"]
