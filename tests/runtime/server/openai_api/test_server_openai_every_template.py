"""Issue 59 items 1 and 2, served: every template docs/serving/openai.md lists serves and answers one request
through the official ``openai`` client (the Qwen-Image-Edit Lightning template could not be served: "no node maps
the request field 'prompt'"), and ``guidance_scale_2`` sent by the client guides the high-noise expert, as the
run's report shows. One server holds every template; whole workflows through its queue: slow.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer

openai = pytest.importorskip("openai", reason='the test extra is not installed (pip install "lorabind[test]")')
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

PACKAGE = Path(lorabind.__file__).parent
DOC = PACKAGE / "docs" / "serving" / "openai.md"


def template_file(name: str) -> Path:
    """``base/qwen_image`` is ``workflows/base/qwen_image.api.json``, the others ``workflows/api/<name>.api.json``."""
    return PACKAGE / "workflows" / (f"{name}.api.json" if name.startswith("base/") else f"api/{name}.api.json")


def listed_templates() -> list[str]:
    """The templates the doc's "Templates." bullet names."""
    text = DOC.read_text(encoding="utf-8")
    bullet = text[text.index("- **Templates.**"):]
    bullet = bullet[:bullet.index("\n- **")]
    return [name for name in re.findall(r"`([a-z0-9_/]+)`", bullet) if template_file(name).is_file()]


def test_the_doc_lists_the_shipped_templates():
    names = listed_templates()
    assert "qwen_image_edit_lightning" in names and {"base/wan22_t2v", "base/qwen_image", "base/minimax_h3"} <= set(
        names)
    assert len(names) == 11


@pytest.fixture(scope="module")
def server(tiny_models_root, tmp_path_factory):
    from lorabind.tiny_models.single_files import write_tiny_single_files
    from wan_i2v_helpers import example_input_dir

    write_tiny_single_files(tiny_models_root)  # the GGUF template's files
    root = tmp_path_factory.mktemp("openai_every_template")
    shutil.copytree(example_input_dir(), root / "input")  # lorabind-tiny/start.png
    models = tuple((name.replace("/", "-"), str(template_file(name))) for name in listed_templates())
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), state_dir=str(root / "state"),
                          openai_models=models)
    srv = BackgroundServer(config).start(timeout=600)
    yield srv
    srv.stop()


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600)


def _ask(server, model: str, **fields):
    return _client(server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "a yellow ball"}], extra_body=fields)


def _last_schedule(server) -> dict:
    with urllib.request.urlopen(server.url + "/history?max_items=1") as reply:
        (entry,) = json.loads(reply.read()).values()
    return next(output["lorabind_schedule"][0] for output in entry["outputs"].values()
                if "lorabind_schedule" in output)


@pytest.mark.parametrize("name", listed_templates())
def test_every_listed_template_serves_one_request(server, name):
    fields = {"seed": 3}
    if name == "qwen_image_edit_lightning":
        fields["image"] = "lorabind-tiny/start.png"  # the picture to edit, by its name in the input folder
    reply = _ask(server, name.replace("/", "-"), **fields)
    (content,) = reply.choices[0].message.content
    assert content["type"] in ("image_url", "video_url")
    url = content[content["type"]]["url"]
    assert url.startswith("data:image/png;base64,") or "/view?" in url


def test_guidance_scale_2_from_the_client_guides_the_high_noise_expert(server):
    _ask(server, "base-wan22_t2v", guidance_scale=1.0, guidance_scale_2=4.0, num_inference_steps=4, seed=5)
    schedule = _last_schedule(server)
    # the sampler's report: cfg is (high-noise expert's, low-noise expert's); the first steps run on the high one
    assert schedule["cfg"] == [4.0, 1.0]
    assert schedule["experts"][0] == "transformer" and schedule["experts"][-1] == "transformer_2"
