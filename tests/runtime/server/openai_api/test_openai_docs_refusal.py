"""docs/serving/openai.md's refused request answers what the page shows (issue 54: the page's text had drifted
from the server's): its curl body with ``"num_inference_steps": 20``, sent to the tiny Qwen-Image Lightning
template, gets the page's JSON error, byte for byte."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer

PACK = Path(lorabind.__file__).parent
PAGE = PACK / "docs" / "serving" / "openai.md"

pytestmark = pytest.mark.slow  # a server with the tiny Qwen-Image template


def _documented() -> tuple[dict, str]:
    """(the curl request's body with 20 steps, the refusal the page shows after it)."""
    text = PAGE.read_text(encoding="utf-8")
    curl = re.search(r"-d '(\{.*?\})' \|", text, re.S).group(1)
    body = json.loads(curl)
    body["extra_body"]["num_inference_steps"] = 20
    refusal = re.search(r'with `"num_inference_steps": 20` is refused.*?```json\n(.*?)\n```', text, re.S).group(1)
    return body, refusal


def test_the_pages_refusal_is_what_the_server_answers(tiny_models_root, tmp_path):
    body, shown = _documented()
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"),
                          state_dir=str(tmp_path / "state"),
                          openai_models=(("qwen-image", str(PACK / "workflows" / "api" / "qwen_image_lightning.api.json")),))
    server = BackgroundServer(config).start(timeout=300)
    try:
        request = urllib.request.Request(server.url + "/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=300)
        answer = refused.value.read().decode()
    finally:
        server.stop()
    assert refused.value.code == 400 and json.loads(answer) == json.loads(shown)
