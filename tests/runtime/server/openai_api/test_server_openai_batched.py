"""vllm-omni's per-request ``lora`` in one batch (issue 53): ``serve --max-batch 3 --lora-backend distill
--lora-path HIGH LOW`` keeps the pair fused for everyone while each request's own PEFT adapter (two users' style
adapters at their own scales, and none) runs on that request's rows only; each answer equals the same request
served one at a time, within one 8-bit level (the engine's float32 tolerance, ``engine_helpers``). Slow."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import lorabind
from engine_helpers import on_threads
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW, _config, _save_peft_folder

openai = pytest.importorskip("openai", reason='the test extra is not installed (pip install "lorabind[test]")')
pytestmark = pytest.mark.slow

TEMPLATE = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_tiny_t2v.api.json"


@pytest.fixture(scope="module")
def adapters(tiny_models_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batched_adapters")
    config = _config(Path(tiny_models_root) / "diffusers" / "tiny-wan22-t2v", "transformer")
    for name, seed in (("ink", 21), ("neon", 22)):
        _save_peft_folder(folder / name, config, seed=seed)
    return folder


def _serve(root: Path, models_root, adapters: Path, max_batch: int) -> BackgroundServer:
    config = ServerConfig(port=0, models_root=str(models_root), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"), state_dir=str(root / "state"),
                          openai_models=(("wan", str(TEMPLATE)),), distill_loras=(WAN22_HIGH, WAN22_LOW),
                          lora_dirs=(str(adapters),), max_batch=max_batch)
    return BackgroundServer(config).start(timeout=300)


def _requests(adapters: Path) -> list:
    """One frame each, so the answer is a PNG data URL (a video would be a link to an animated file)."""
    return [{"seed": 1, "num_frames": 1, "lora": {"name": "ink", "path": str(adapters / "ink"), "scale": 0.5}},
            {"seed": 2, "num_frames": 1},
            {"seed": 3, "num_frames": 1, "lora": {"name": "neon", "path": str(adapters / "neon"), "scale": 1.5}}]


def _answer(server, extra: dict) -> np.ndarray:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600)
    chat = client.chat.completions.create(model="wan", messages=[{"role": "user", "content": "a fox"}],
                                          extra_body=extra)
    payload = chat.choices[0].message.content[0]["image_url"]["url"].partition(",")[2]
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"), dtype=np.int16)


def test_per_request_adapters_share_a_batch_over_the_fused_pair(tiny_models_root, adapters, tmp_path):
    from lorabind.loaders.models import store as model_store

    model_store.clear_cache()
    serial = _serve(tmp_path / "serial", tiny_models_root, adapters, 1)
    try:
        alone = [_answer(serial, extra) for extra in _requests(adapters)]
    finally:
        serial.stop()
    batched = _serve(tmp_path / "batched", tiny_models_root, adapters, 3)
    try:
        results = on_threads([lambda extra=extra: _answer(batched, extra) for extra in _requests(adapters)])
        reports = _batching_reports(batched)
    finally:
        batched.stop()
    for (got, error), want in zip(results, alone):
        assert error is None
        assert int(np.abs(got - want).max()) <= 1
    assert max(report["largest_batch"] for report in reports) >= 2  # under load one may arrive a step late
    assert sorted(name for report in reports for name in report["row_applied"]) == ["ink", "neon"]


def _batching_reports(server) -> list:
    import json
    import urllib.request

    with urllib.request.urlopen(server.url + "/history") as reply:
        history = json.loads(reply.read())
    return [output["lorabind_schedule"][0]["batching"] for prompt_id, entry in history.items()
            if not prompt_id.startswith("warm-up") for output in entry["outputs"].values()
            if "lorabind_schedule" in output]
