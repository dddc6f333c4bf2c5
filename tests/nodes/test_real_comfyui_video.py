"""LoraBindSaveVideo inside real ComfyUI (each version of ``real_comfyui.COMFY_VERSIONS``), beside ComfyUI's own
``CreateVideo`` + ``SaveVideo`` on the same frames: both MP4s report the same way in the history, decode to the same frame count and size, and carry the
prompt and workflow under the same metadata keys (the ``moov/udta/meta/keys`` names the frontend reads). So the
layout in ``loaders/io/video_files.py`` is ComfyUI's own, checked against ComfyUI rather than against our reading
of its source. (ComfyUI's saver gets no soundtrack here: its AAC encoder refuses the tiny model's 320 Hz.)
"""

import json
from pathlib import Path

import av
import pytest

import lorabind
from real_comfyui import RealComfyUI

pytestmark = pytest.mark.slow

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"
NAME = "minimax_h3_turbo_mp4"


@pytest.fixture(scope="module")
def comfy(tmp_path_factory, mm_root, comfy_version):
    with RealComfyUI(tmp_path_factory.mktemp("comfy_video"), mm_root, version=comfy_version) as running:
        status, info = running.get("/object_info/LoraBindSaveVideo")
        assert status == 200 and "LoraBindSaveVideo" in info, running.log_tail()
        yield running


def metadata_key_names(data: bytes) -> list[str]:
    """The names in an MP4's ``keys`` box (version/flags, count, then size + ``mdta`` + name per entry)."""
    start = data.index(b"keys") + 4
    count = int.from_bytes(data[start + 4:start + 8], "big")
    names, position = [], start + 8
    for _ in range(count):
        size = int.from_bytes(data[position:position + 4], "big")
        assert data[position + 4:position + 8] == b"mdta"
        names.append(data[position + 8:position + size].decode("utf-8"))
        position += size
    return names


def decoded(path: Path) -> tuple[int, int, int, dict]:
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
        metadata = {key: json.loads(value) for key, value in container.metadata.items()
                    if key in ("prompt", "workflow")}
    return len(frames), frames[0].width, frames[0].height, metadata


def test_our_mp4_and_comfyuis_savevideo_report_and_embed_alike(comfy):
    prompt = json.loads((WORKFLOWS / f"{NAME}.api.json").read_text(encoding="utf-8"))
    workflow = json.loads((TEMPLATES / f"{NAME}.json").read_text(encoding="utf-8"))
    prompt["20"] = {"class_type": "CreateVideo", "inputs": {"images": ["7", 0], "fps": 24.0}}
    prompt["21"] = {"class_type": "SaveVideo", "inputs": {"video": ["20", 0], "filename_prefix": "comfy/video",
                                                          "format": "auto", "codec": "auto"}}
    run = comfy.run(prompt, extra_data={"extra_pnginfo": {"workflow": workflow}})
    assert run.status == 200 and run.error is None, (run.body, run.error, comfy.log_tail())
    ours, theirs = run.history["outputs"]["8"], run.history["outputs"]["21"]
    assert ours["animated"] == theirs["animated"] == [True]
    assert [sorted(item) for item in ours["images"]] == [sorted(item) for item in theirs["images"]]
    files = [comfy.base / item["type"] / item["subfolder"] / item["filename"]
             for item in (ours["images"][0], theirs["images"][0])]
    assert [path.suffix for path in files] == [".mp4", ".mp4"]
    (our_frames, our_width, our_height, our_metadata), (frames, width, height, metadata) = map(decoded, files)
    assert (our_frames, our_width, our_height) == (frames, width, height) == (5, 32, 32)
    assert our_metadata == metadata and metadata["workflow"] == workflow and set(metadata["prompt"]) == set(prompt)
    assert sorted(metadata_key_names(files[0].read_bytes())) == sorted(metadata_key_names(files[1].read_bytes()))
    with av.open(str(files[0])) as container:
        assert len(container.streams.audio) == 1  # ours has its soundtrack inside
