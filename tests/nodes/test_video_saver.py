"""LoraBindSaveVideo writes MP4 (H.264 + AAC) and WebM (VP9 + Opus) files that decode to the frames given, with
the soundtrack exactly as long as the video, the prompt and workflow where ComfyUI's frontend reads them, no
local path inside, and the result reported the way ComfyUI reports a saved video.

Checked by decoding (frame count, size, stream lengths, colours within a lossy codec's reach), never by the
codec's bytes."""

from __future__ import annotations

import json
import sys

import av
import pytest
import torch

from lorabind.loaders.errors import LoraBindError
from lorabind.loaders.io.video_files import VIDEO_FORMATS, first_video_frame
from lorabind.nodes.video_nodes import LoraBindSaveVideo
from lorabind.runtime import folder_paths

MP4, WEBM = "mp4 (h264 + aac)", "webm (vp9 + opus)"
PROMPT = {"1": {"class_type": "LoraBindSaveVideo", "inputs": {"fps": 8.0}}}
# MP4 counts audio in samples (exact); Matroska in milliseconds, each packet's start and length rounded to one
END_TOLERANCE = {MP4: 1e-4, WEBM: 2e-3}
WORKFLOW = {"id": "wf-1", "nodes": [{"id": 1, "type": "LoraBindSaveVideo"}], "links": []}


@pytest.fixture
def output(tmp_path):
    folder_paths.configure(models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "out"))
    yield tmp_path / "out"
    folder_paths.configure()


def save(frames, audio=None, video_format=MP4, fps=8.0, **extra):
    return LoraBindSaveVideo().save(frames, "clips/v", fps, video_format, 23, "ultrafast", audio=audio,
                                    prompt=PROMPT, extra_pnginfo={"workflow": WORKFLOW}, **extra)["ui"]


def colour_frames(count: int, height: int, width: int) -> torch.Tensor:
    """Flat frames of distinct colours: a lossy codec keeps a flat colour within a few levels."""
    levels = torch.linspace(0.1, 0.9, count)
    return torch.stack([torch.stack([level, 1 - level, torch.tensor(0.5)]).expand(height, width, 3)
                        for level in levels])


def audio_end_seconds(container) -> float:
    """Where the audio stream ends: the last packet's end, as players and the MP4 edit list count it (the
    decoder itself returns whole codec frames, so decoded samples overshoot by the last frame's padding)."""
    stream = container.streams.audio[0]
    end = max(packet.pts + packet.duration for packet in container.demux(stream) if packet.size)
    return float(end * stream.time_base)


@pytest.mark.parametrize("video_format", [MP4, WEBM])
def test_frames_sound_and_metadata_round_trip(output, video_format):
    frames = colour_frames(6, 24, 40)
    audio = {"waveform": torch.sin(torch.arange(2 * 44100).float() / 20).reshape(1, 2, -1) * 0.5,
             "sample_rate": 44100}  # one second of sound for a video of 6 / 8 = 0.75 s: cut to the video
    ui = save(frames, audio, video_format)
    extension = VIDEO_FORMATS[video_format].extension
    assert ui == {"images": [{"filename": f"v_00001_.{extension}", "subfolder": "clips", "type": "output"}],
                  "animated": [True]}  # ComfyUI's ui.PreviewVideo
    path = output / "clips" / f"v_00001_.{extension}"
    with av.open(str(path)) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        metadata = {key.lower(): value for key, value in container.metadata.items()}
    assert len(decoded) == 6 and decoded[0].shape == (24, 40, 3)
    expected = (frames * 255).round().numpy()
    assert max(abs(got.astype(float) - want).max() for got, want in zip(decoded, expected)) <= 12
    assert json.loads(metadata["prompt"]) == PROMPT and json.loads(metadata["workflow"]) == WORKFLOW
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert (stream.codec_context.name, stream.channels) == (
            {MP4: "aac", WEBM: "opus"}[video_format], 2)
        assert audio_end_seconds(container) == pytest.approx(6 / 8, abs=END_TOLERANCE[video_format])
    assert str(output) not in path.read_bytes().decode("latin-1")  # no local path in the file


def test_short_sound_is_padded_and_odd_rates_resampled_to_the_videos_length(output):
    audio = {"waveform": torch.ones(1, 1, 100) * 0.3, "sample_rate": 320}  # 0.31 s at a rate AAC does not take
    ui = save(colour_frames(8, 16, 16), audio, fps=4.0)  # a 2 s video
    with av.open(str(output / "clips" / ui["images"][0]["filename"])) as container:
        stream = container.streams.audio[0]
        assert (stream.rate, stream.channels) == (48000, 1)
        assert audio_end_seconds(container) == pytest.approx(2.0, abs=END_TOLERANCE[MP4])
    with av.open(str(output / "clips" / ui["images"][0]["filename"])) as container:
        sound = torch.cat([torch.from_numpy(f.to_ndarray()).flatten() for f in container.decode(audio=0)])
    loud = (sound.abs() > 0.1).nonzero()
    assert 0.2 < loud.max().item() / 48000 < 0.45  # the sound where it was, silence after it


def test_odd_sizes_are_padded_to_even_and_said(output):
    frames = colour_frames(3, 15, 21)
    ui = save(frames)
    assert ui["text"] == ["21x15 padded to 22x16: yuv420p needs an even width and height"]
    path = output / "clips" / ui["images"][0]["filename"]
    with av.open(str(path)) as container:
        assert len(container.streams.audio) == 0  # no soundtrack given
        first = next(container.decode(video=0))
    assert (first.width, first.height) == (22, 16)
    assert first_video_frame(str(path)).size == (22, 16)


def test_mp4_metadata_sits_before_the_frames(output):
    """faststart: ``moov`` (with the workflow) precedes ``mdat``, so the frontend's first-64-MiB read finds it in a
    long video too."""
    ui = save(colour_frames(4, 16, 16))
    data = (output / "clips" / ui["images"][0]["filename"]).read_bytes()
    boxes, position = [], 0
    while position + 8 <= len(data):  # the top-level boxes: 32-bit size, 4-letter type
        size = int.from_bytes(data[position:position + 4], "big")
        boxes.append(data[position + 4:position + 8].decode("latin-1"))
        position += size
    assert position == len(data) and boxes.index("moov") < boxes.index("mdat"), boxes


def test_webm_tags_are_the_upper_case_names_the_frontend_reads_before_the_frames(output):
    """The frontend's WebM reader takes ``SimpleTag`` names exactly ``PROMPT``/``WORKFLOW``, in the first 2 MiB."""
    ui = save(colour_frames(4, 16, 16), video_format=WEBM)
    data = (output / "clips" / ui["images"][0]["filename"]).read_bytes()
    first_cluster = data.index(bytes.fromhex("1F43B675"))
    assert data.index(b"PROMPT") < first_cluster and data.index(b"WORKFLOW") < first_cluster
    assert b"prompt" not in data and b"workflow" not in data


def test_bad_soundtracks_and_choices_are_refused_by_name(output):
    with pytest.raises(LoraBindError, match="LoraBindSaveVideo: audio has 3 channels"):
        save(colour_frames(2, 16, 16), {"waveform": torch.zeros(1, 3, 100), "sample_rate": 16000})
    with pytest.raises(LoraBindError, match="LoraBindSaveVideo: unknown format 'avi'"):
        save(colour_frames(2, 16, 16), video_format="avi")
    assert not any((output / "clips").glob("*.mp4"))  # nothing half-written stays


def _nan_frames():
    frames = colour_frames(2, 16, 16)
    frames[1, 3, 3, 0] = float("nan")
    return frames


@pytest.mark.parametrize("frames, audio, message", [
    (torch.zeros(0, 16, 16, 3), None, r"images hold no frame to save \(shape \[0, 16, 16, 3\]\)"),
    (_nan_frames(), None, "images hold NaN or infinite pixel values"),
    (colour_frames(2, 16, 16), {"waveform": torch.full((1, 1, 100), float("nan")), "sample_rate": 16000},
     "audio holds NaN or infinite samples"),
    (colour_frames(2, 16, 16), {"waveform": torch.zeros(1, 1, 100), "sample_rate": 0},
     "audio sample_rate 0 is not a rate from 1 to 384000 Hz"),
    (colour_frames(2, 16, 16), {"waveform": torch.zeros(1, 1, 100), "sample_rate": 384_001},
     "audio sample_rate 384001 is not a rate"),
])
def test_media_nothing_could_play_or_that_would_save_wrong_is_refused_naming_the_node(output, frames, audio,
                                                                                      message):
    with pytest.raises(LoraBindError, match=f"^LoraBindSaveVideo: {message}"):
        save(frames, audio)
    assert not any((output / "clips").glob("*.mp4"))


def test_a_sample_rate_at_the_bound_is_saved(output):
    save(colour_frames(2, 16, 16), {"waveform": torch.zeros(1, 1, 100), "sample_rate": 384_000})
    assert len(list((output / "clips").glob("*.mp4"))) == 1


def test_a_missing_pyav_is_named_with_its_install_command(output, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # import av now raises ImportError
    with pytest.raises(LoraBindError, match="LoraBindSaveVideo needs PyAV .*pip install av"):
        save(colour_frames(2, 16, 16))


def test_declared_choices_match_the_writer():
    required = LoraBindSaveVideo.INPUT_TYPES()["required"]
    assert required["format"][0] == [MP4, WEBM]
    assert required["preset"][1]["default"] == "medium" and "veryslow" in required["preset"][0]
    assert LoraBindSaveVideo.INPUT_TYPES()["optional"]["audio"][0] == "AUDIO"
