"""``GET /lorabind/contract?name=[&folder=]``: what a LoRA, PEFT folder, MiniMax-H3 adapter or model folder
declares, answered while editing: the same contract ``inspect --json`` reports and the nodes enforce."""

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from lorabind.loaders.dispatch.contract_discovery import contract_to_dict
from lorabind.loaders.families import checkpoint_contracts
from lorabind.loaders.families.minimax_h3.contracts import file_contract
from lorabind.runtime.commands.inspect import inspect_lora
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from lorabind.tiny_models.lora_fixtures import FIXTURE_NAMES, PEFT_FOLDER
from lorabind.tiny_models.minimax_h3 import FIXTURE_NAMES as MINIMAX_FIXTURE_NAMES


@pytest.fixture(scope="module")
def contract_server(tmp_path_factory, build_tiny_root):
    state = tmp_path_factory.mktemp("contracts")
    srv = BackgroundServer(ServerConfig(port=0, models_root=str(build_tiny_root), output_dir=str(state / "output"),
                                        input_dir=str(state / "input"), temp_dir=str(state / "temp"))).start()
    yield srv
    srv.stop()


def _get(srv, name, **query):
    url = f"{srv.url}/api/lorabind/contract?" + urllib.parse.urlencode({"name": name, **query})
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_every_build_tiny_lora_answers_the_contract_inspect_reports(contract_server, build_tiny_root):
    names = [*FIXTURE_NAMES, *MINIMAX_FIXTURE_NAMES]
    assert len(names) == 18 and PEFT_FOLDER in names  # 9 Wan/Qwen (one a PEFT folder), 9 MiniMax-H3
    declared = set()
    for name in names:
        status, body = _get(contract_server, name)
        assert status == 200, (name, body)
        assert body["contract"] == inspect_lora(str(build_tiny_root / "loras" / name))["contract"], name
        assert body["contracts"] == ([body["contract"]] if body["contract"] else []), name
        assert (body["contract"] is None) == (body["reason"] is not None), name
        if body["contract"]:
            declared.add(name)
    # every published-name fixture declares one; the user-trained PEFT folder declares none, and says why
    assert declared == set(names) - {PEFT_FOLDER}
    status, body = _get(contract_server, PEFT_FOLDER)
    assert body["reason"] == "its name and metadata declare no sampling contract" and body["family"] == "wan"


def test_the_answer_is_what_the_nodes_enforce(contract_server, build_tiny_root):
    """MiniMaxTurboSchedule reads a Turbo/native file with ``file_contract``; a Wan pair declares 4 steps,
    shift 5 and cfg 1 by its file name, the values the sampler refuses 20 steps against."""
    for name in MINIMAX_FIXTURE_NAMES:
        _, body = _get(contract_server, name)
        assert body["contract"] == contract_to_dict(file_contract(build_tiny_root / "loras" / name)), name
        assert body["family"] == "minimax_h3"
    _, high = _get(contract_server, FIXTURE_NAMES[0])
    assert {key: high["contract"][key] for key in ("steps", "shift", "cfg", "tasks", "declared_by")} == \
        {"steps": 4, "shift": 5.0, "cfg": 1.0, "tasks": None, "declared_by": "file name"}


def test_model_folders_answer_the_contract_their_loader_attaches(contract_server, mm_models):
    status, pinned = _get(contract_server, "tiny-minimax-h3-pinned", folder="diffusers")
    assert status == 200, pinned
    assert pinned["contracts"] == [contract_to_dict(c) for c in checkpoint_contracts(mm_models["pinned"])]
    assert pinned["contract"]["declared_by"] == "checkpoint" and pinned["contract"]["steps"] >= 1
    status, plain = _get(contract_server, "tiny-wan22-t2v", folder="diffusers")
    assert status == 200 and plain["contract"] is None and plain["contracts"] == []
    assert plain["reason"] == "its model_index.json pins no schedule and carries no baked-in contract"


def test_unknown_escaping_and_refused_names(contract_server, build_tiny_root):
    status, body = _get(contract_server, "missing.safetensors")
    assert status == 404 and body["contract"] is None
    assert body["reason"] == "no LoRA file or PEFT adapter folder named 'missing.safetensors' in the loras folder"
    status, body = _get(contract_server, "no-such-model", folder="diffusers")
    assert status == 404 and "no diffusers model folder named 'no-such-model'" in body["reason"]
    for escaping in ("../../etc/passwd", "lorabind-tiny/../../../etc/passwd", "/etc/passwd"):
        status, body = _get(contract_server, escaping)
        assert status == 400 and body["contract"] is None and "Refusing model name" in body["reason"], escaping
    status, body = _get(contract_server, "x", folder="checkpoints")
    assert status == 400 and body["reason"] == "folder 'checkpoints' is not one of ['diffusers', 'diffusion_models', 'loras']"
    status, body = _get(contract_server, "a" * 2000)
    assert status == 400 and "longer than 1024 characters" in body["reason"]
    # a folder that is neither a LoRA nor a PEFT adapter: refused with the reader's reason, naming it
    status, body = _get(contract_server, "lorabind-tiny")
    assert status == 422 and "lorabind-tiny" in body["reason"], body


def test_a_builtin_tiny_model_not_built_yet_is_no_error(registry_at, tmp_path):
    """The loader builds tiny-* on first use, so a fresh install's canvas says so instead of 'not found'."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from lorabind.nodes.editor_routes import CONTRACT_PATH, get_declared_contract

    registry_at(tmp_path / "empty-models")
    app = web.Application()
    app.router.add_get(CONTRACT_PATH, get_declared_contract)

    async def ask(*names):
        async with TestClient(TestServer(app)) as client:
            answers = []
            for name in names:
                response = await client.get(CONTRACT_PATH, params={"name": name, "folder": "diffusers"})
                answers.append((response.status, await response.json()))
            return answers

    (status, body), (missing, _) = asyncio.run(ask("tiny-minimax-h3-pinned", "my-own-model"))
    assert status == 200 and body["contract"] is None and "not built yet" in body["reason"]
    assert missing == 404
