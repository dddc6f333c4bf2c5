"""The shipped MiniMax-H3 OpenAI template (``minimax_h3_turbo_4step_768p.api.json``, the 768p FL2V Turbo LoRA)
served to the ``openai`` client with MiniMax-H3's request fields: ``task``, ``flow_shift`` and ``audio_flow_shift``
run as the Turbo contract wants them, and are refused with a 400 naming the file and the field otherwise. Whole
workflows through the server's queue: slow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from optional_extras import deferred, requires

openai = deferred("openai")
pytestmark = [requires("openai"), pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TEMPLATE = "minimax_h3_turbo_4step_768p.api.json"
TURBO = "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors"


@pytest.fixture(scope="module")
def client(tiny_models_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("openai_minimax")
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), state_dir=str(root / "state"),
                          openai_models=(("h3", str(Path(lorabind.__file__).parent / "workflows" / TEMPLATE)),))
    srv = BackgroundServer(config).start(timeout=600)
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=600)
    srv.stop()


def _ask(client, **fields):
    return client.chat.completions.create(model="h3", messages=[{"role": "user", "content": "a cat"}],
                                          extra_body=fields)


def test_the_turbo_contracts_task_and_shifts_run(client):
    reply = _ask(client, task="t2va", flow_shift=6.0, audio_flow_shift=3.0, num_inference_steps=4)
    assert [part["type"] for part in reply.choices[0].message.content] == ["video_url"]


@pytest.mark.parametrize("fields, param", [({"flow_shift": 12.0}, "flow_shift"),
                                           ({"audio_flow_shift": 5.0}, "audio_flow_shift"),
                                           ({"task": "ref2va"}, "task")])
def test_what_the_turbo_contract_refuses_is_a_400_naming_the_file_and_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(client, **fields)
    assert caught.value.body["param"] == param
    assert TURBO in caught.value.body["message"] and TEMPLATE in caught.value.body["message"]
