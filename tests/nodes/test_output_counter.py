"""One run's outputs share their number: a video and its soundtrack under one prefix are ``…_00001_.webp`` and
``…_00001_.wav`` (ComfyUI's counter over every extension would make the WAV ``_00002_``)."""

from __future__ import annotations

import torch

from lorabind.nodes.minimax_nodes import LoraBindSaveAudio
from lorabind.nodes.output_nodes import LoraBindSaveImage
from lorabind.runtime import folder_paths


def test_a_video_and_its_soundtrack_share_the_counter(tmp_path):
    folder_paths.configure(models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "out"))
    try:
        frames = torch.rand(3, 8, 8, 3)
        audio = {"waveform": torch.zeros(1, 2, 64), "sample_rate": 16000}
        names = []
        for _ in range(2):  # two runs
            names.append(LoraBindSaveImage().save(frames, "clips/h3")["ui"]["images"][0]["filename"])
            names.append(LoraBindSaveAudio().save(audio, "clips/h3")["ui"]["audio"][0]["filename"])
        (tmp_path / "out" / "clips" / "h3_00007_.png").write_bytes(b"")  # another kind counts separately
        names.append(LoraBindSaveImage().save(frames, "clips/h3")["ui"]["images"][0]["filename"])
    finally:
        folder_paths.configure()
    assert names == ["h3_00001_.webp", "h3_00001_.wav", "h3_00002_.webp", "h3_00002_.wav", "h3_00003_.webp"]
    assert sorted(p.name for p in (tmp_path / "out" / "clips").iterdir()) == [
        "h3_00001_.wav", "h3_00001_.webp", "h3_00002_.wav", "h3_00002_.webp", "h3_00003_.webp", "h3_00007_.png"]
