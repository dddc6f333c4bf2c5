"""Video files people can play: MP4 (H.264 + AAC) or WebM (VP9 + Opus) through PyAV, with the soundtrack muxed
in and the prompt and workflow in the container's metadata, written atomically.

Where the metadata goes, so ComfyUI's frontend reopens the file (facts from ComfyUI 0.3.64 and the frontend
package 1.58.1; read, not copied):

- ComfyUI's ``comfy_api/latest/_input_impl/video_types.py`` (``VideoFromComponents.save_to``, behind the core
  ``SaveVideo`` node) sets ``container.metadata[key] = json.dumps(value)`` for ``prompt`` and each
  ``extra_pnginfo`` key (``workflow``) and opens MP4 with ``options={"movflags": "use_metadata_tags"}``, so FFmpeg
  writes them as ``moov/udta/meta`` with a ``keys`` box (``mdta``) and an ``ilst`` of values. Its ``SaveWEBM``
  (``comfy_extras/nodes_video.py``) sets the same keys on a WebM, where FFmpeg's Matroska muxer writes them as
  upper-case ``SimpleTag`` names (``PROMPT``, ``WORKFLOW``).
- The frontend's ``getWorkflowDataFromFile`` reads ``.mp4``/``video/mp4`` with ``getFromIsobmffFile`` (the first
  64 MiB: ``udta`` at the top level or inside ``moov``, then ``meta``/``keys``/``ilst``, JSON parsed for the key
  names ``prompt`` and ``workflow`` in any case) and ``video/webm`` with ``getFromWebmFile`` (the first 2 MiB:
  ``SimpleTag`` names exactly ``PROMPT``/``WORKFLOW``). We add ``faststart`` so ``moov`` (and the workflow)
  sits before the frames: a long video still has its workflow inside the 64 MiB the frontend reads.

The audio is cut or padded with silence to the video's duration (frames / fps), after resampling to a rate the
audio codec takes (the tiny MiniMax-H3 speaks at 320 Hz; AAC and Opus do not), so both streams end together.
yuv420p stores colour at half resolution, so H.264 and VP9 need an even width and height: an odd size is padded
by repeating the last row/column, and the caller is told (``VideoWritten.padded``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from .atomic_files import write_atomically

VIDEO_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
# libvpx-vp9 has no presets: its speed/quality dial is cpu-used (0 slowest and best .. 8 fastest), mapped so
# that one preset choice means the same trade-off in both formats.
VP9_CPU_USED = dict(zip(VIDEO_PRESETS, (8, 7, 6, 5, 4, 3, 2, 1, 0)))
FALLBACK_AUDIO_RATE = 48000  # taken by both AAC and Opus
CHANNEL_LAYOUTS = {1: "mono", 2: "stereo"}
PIXEL_FORMAT = "yuv420p"
MAX_SAMPLE_RATE = 384_000  # the highest rate audio interfaces record at


def x264_options(crf: int, preset: str) -> dict:
    return {"crf": str(crf), "preset": preset}


def vp9_options(crf: int, preset: str) -> dict:
    """Constant quality (crf with the bitrate cap off), speed from the preset's place among x264's."""
    return {"crf": str(crf), "b:v": "0", "cpu-used": str(VP9_CPU_USED[preset]), "row-mt": "1"}


@dataclass(frozen=True)
class VideoFormat:
    container: str
    extension: str
    video_codec: str
    audio_codec: str
    container_options: dict
    video_options: Callable[[int, str], dict]  # (crf, preset) -> the encoder's options


VIDEO_FORMATS = {
    "mp4 (h264 + aac)": VideoFormat("mp4", "mp4", "libx264", "aac", {"movflags": "use_metadata_tags+faststart"},
                                    x264_options),
    "webm (vp9 + opus)": VideoFormat("webm", "webm", "libvpx-vp9", "libopus", {}, vp9_options),
}


@dataclass(frozen=True)
class VideoWritten:
    width: int
    height: int
    padded: bool  # an odd width/height was padded to even (yuv420p)


def even_frames(frames):
    """IMAGE float [F, H, W, 3] in 0..1 -> uint8 numpy [F, H', W', 3] with H', W' even (edge rows repeated)."""
    import numpy as np
    import torch

    array = (frames.detach().float().cpu().clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).numpy()
    pad_h, pad_w = array.shape[1] % 2, array.shape[2] % 2
    if pad_h or pad_w:
        array = np.pad(array, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return array


def fitted_soundtrack(waveform, sample_rate: int, codec: str, seconds: float):
    """(float32 numpy [channels, samples], rate): the waveform at a rate ``codec`` takes, cut or padded with
    silence to exactly ``seconds``. ``waveform`` is [channels, samples] or [batch, channels, samples]; batch
    items follow one another, as the frames of a batch do in IMAGE."""
    import av
    import numpy as np

    if waveform.dim() == 3:
        waveform = waveform.permute(1, 0, 2).reshape(waveform.shape[1], -1)
    channels = int(waveform.shape[0])
    if channels not in CHANNEL_LAYOUTS:
        raise ValueError(f"audio has {channels} channels; a video soundtrack takes 1 (mono) or 2 (stereo)")
    rates = av.codec.Codec(codec, "w").audio_rates or ()
    rate = int(sample_rate) if not rates or int(sample_rate) in rates else FALLBACK_AUDIO_RATE
    samples = waveform.detach().float().cpu().clamp(-1, 1).contiguous().numpy()
    if rate != int(sample_rate):
        samples = _resampled(samples, int(sample_rate), rate)
    wanted = round(seconds * rate)
    fitted = np.zeros((channels, wanted), dtype=np.float32)
    kept = min(wanted, samples.shape[1])
    fitted[:, :kept] = samples[:, :kept]
    return fitted, rate


def _resampled(samples, source_rate: int, rate: int):
    """[channels, samples] float32 at ``source_rate`` -> at ``rate``, through FFmpeg's resampler (flushed)."""
    import av
    import numpy as np

    layout = CHANNEL_LAYOUTS[samples.shape[0]]
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format="fltp", layout=layout)
    frame.sample_rate, frame.pts = source_rate, 0
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
    pieces = [out.to_ndarray() for out in [*resampler.resample(frame), *resampler.resample(None)]]
    return np.concatenate(pieces, axis=1) if pieces else np.zeros((samples.shape[0], 0), dtype=np.float32)


def write_video(path: str, frames, fps: float, video_format: VideoFormat, crf: int, preset: str,
                audio: dict | None = None, metadata: dict | None = None) -> VideoWritten:
    """Encode IMAGE ``frames`` (and ComfyUI AUDIO ``{"waveform", "sample_rate"}``) into ``path``; every value of
    ``metadata`` is stored as JSON under its key (``prompt``, ``workflow``). ValueError, before anything is
    written, for what no player could open or what would be saved wrong silently: no frames, non-finite
    pixels or samples, a sample rate that is not positive."""
    _check_media(frames, audio)
    pixels = even_frames(frames)
    soundtrack = None
    if audio is not None:
        soundtrack = fitted_soundtrack(audio["waveform"], audio["sample_rate"], video_format.audio_codec,
                                       len(pixels) / fps)
    write_atomically(path, lambda temp: _encode(temp, pixels, fps, video_format, crf, preset, soundtrack,
                                                metadata or {}))
    return VideoWritten(width=pixels.shape[2], height=pixels.shape[1],
                        padded=pixels.shape[1:3] != tuple(frames.shape[1:3]))


def _check_media(frames, audio: dict | None) -> None:
    import torch

    if frames.dim() != 4 or frames.shape[0] == 0 or 0 in frames.shape[1:3]:
        raise ValueError(f"images hold no frame to save (shape {list(frames.shape)}); a video needs at least one")
    if not bool(torch.isfinite(frames).all()):
        raise ValueError("images hold NaN or infinite pixel values (a failed decode or an overflow upstream); "
                         "nothing was saved")
    if audio is None:
        return
    rate = audio.get("sample_rate")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 1 \
            or rate > MAX_SAMPLE_RATE:
        raise ValueError(f"audio sample_rate {rate!r} is not a rate from 1 to {MAX_SAMPLE_RATE} Hz")
    if not bool(torch.isfinite(audio["waveform"]).all()):
        raise ValueError("audio holds NaN or infinite samples; nothing was saved")


def _encode(path, pixels, fps, video_format, crf, preset, soundtrack, metadata) -> None:
    """Each frame is muxed with the sound of its time span, so the file interleaves the two streams (a player
    reading it front to back finds both together; FFmpeg's muxer need not hold one stream back)."""
    import av

    with av.open(path, mode="w", format=video_format.container,
                 options=video_format.container_options) as container:
        for key, value in metadata.items():
            container.metadata[key] = json.dumps(value)
        video = container.add_stream(video_format.video_codec, rate=Fraction(round(fps * 1000), 1000))
        video.width, video.height, video.pix_fmt = pixels.shape[2], pixels.shape[1], PIXEL_FORMAT
        video.options = video_format.video_options(crf, preset)
        sound = _SoundFeed(container, video_format.audio_codec, soundtrack, len(pixels)) if soundtrack else None
        for index, image in enumerate(pixels):
            container.mux(video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
            if sound is not None:
                sound.feed_until(index + 1)
        container.mux(video.encode(None))
        if sound is not None:
            sound.finish()


class _SoundFeed:
    """The soundtrack handed to its encoder in step with the frames: up to frame ``n`` means the samples before
    ``n / frames`` of the whole."""

    def __init__(self, container, codec: str, soundtrack, frames: int):
        self.container, (self.samples, self.rate), self.frames = container, soundtrack, frames
        self.layout = CHANNEL_LAYOUTS[self.samples.shape[0]]
        self.stream = container.add_stream(codec, rate=self.rate, layout=self.layout)
        self.sent = 0

    def feed_until(self, frame: int) -> None:
        import av

        end = self.samples.shape[1] * frame // self.frames
        if end <= self.sent:
            return
        chunk = av.AudioFrame.from_ndarray(self.samples[:, self.sent:end].copy(), format="fltp", layout=self.layout)
        chunk.sample_rate, chunk.pts = self.rate, self.sent
        self.container.mux(self.stream.encode(chunk))
        self.sent = end

    def finish(self) -> None:
        self.feed_until(self.frames)
        self.container.mux(self.stream.encode(None))


def first_video_frame(path: str):
    """The first frame of a video file as an RGB PIL image (the served editor's template thumbnails)."""
    import av

    with av.open(path) as container:
        return next(container.decode(video=0)).to_image()


def is_video_file(name: str) -> bool:
    return name.lower().endswith(tuple(f".{video_format.extension}" for video_format in VIDEO_FORMATS.values()))
