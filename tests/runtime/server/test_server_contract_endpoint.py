"""``GET /lorabind/contract?name=``: what a LoRA declares, answered while editing, the same as ``inspect --json``."""

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer

from lorabind.runtime.commands.inspect import inspect_lora


@pytest.fixture(scope="module")
def contract_server(tmp_path_factory, tiny_models_root):
    root = tmp_path_factory.mktemp("contracts")
    srv = BackgroundServer(ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(root / "output"),
                                        input_dir=str(root / "input"), temp_dir=str(root / "temp"))).start()
    yield srv, Path(tiny_models_root) / "loras"
    srv.stop()


def _get(srv, name):
    url = f"{srv.url}/lorabind/contract?" + urllib.parse.urlencode({"name": name})
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode()
        return exc.code, json.loads(text) if exc.headers.get_content_type() == "application/json" else text


def test_every_fixture_lora_answers_the_contract_inspect_reports(contract_server):
    srv, loras = contract_server
    files = sorted(p for p in loras.rglob("*.safetensors"))
    assert len(files) >= 4
    declared = 0
    for path in files:
        name = path.relative_to(loras).as_posix()
        status, body = _get(srv, name)
        assert status == 200, (name, body)
        assert body["contract"] == inspect_lora(str(path))["contract"], name
        assert (body["contract"] is None) == (body["reason"] is not None), name
        declared += body["contract"] is not None
    assert declared >= 1


def test_unknown_and_escaping_names_are_refused(contract_server):
    srv, _ = contract_server
    status, body = _get(srv, "missing.safetensors")
    assert status == 404 and body["contract"] is None and "missing.safetensors" in body["reason"]
    status, text = _get(srv, "../../etc/passwd")
    assert status == 400 and "'..'" in text
