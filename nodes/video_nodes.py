"""LoraBindSaveVideo: frames (and a soundtrack) as an MP4 (H.264 + AAC) or WebM (VP9 + Opus) people can play,
with the prompt and workflow in the container's metadata where ComfyUI's own SaveVideo puts them, so the file
drag-and-drops back into the ComfyUI frontend (the facts are cited in ``loaders/io/video_files.py``).

The result is reported as ComfyUI's ``ui.PreviewVideo`` does (``comfy_api/latest/_ui.py``): the file under
``images`` with ``animated: [True]``. The frontend tells a video from a picture by the file's suffix
(``isVideoResult``: ``.mp4``/``.webm`` are videos whatever the output key), so the node and the queue panel
play it.
"""

from __future__ import annotations

import os

from ..usecases.verbs import write_video
from ..usecases.vocabulary import SOCKET_AUDIO, SOCKET_IMAGE, VIDEO_FORMATS, VIDEO_PRESETS, LoraBindError
from .output_nodes import SAVERS_CATEGORY, filename_prefix_input, output_target

MAX_CRF = 51  # libx264's scale (0 lossless .. 51 worst); libvpx-vp9 takes 0..63, so every value fits both


class LoraBindSaveVideo:
    DESCRIPTION = (
        "Saves frames as a video people can play: MP4 (H.264, yuv420p, AAC sound) or WebM (VP9, Opus sound). "
        "A soundtrack (e.g. MiniMax-H3's) is muxed in, cut or padded with silence to the video's length. The "
        "prompt and workflow are embedded the way ComfyUI's SaveVideo does, so the file loads back into ComfyUI. "
        "yuv420p needs an even width and height: an odd size is padded by repeating the last row/column."
    )
    CATEGORY = SAVERS_CATEGORY
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "images": (SOCKET_IMAGE, {"tooltip": "The frames, in order (a batch's videos follow one another)."}),
                "filename_prefix": filename_prefix_input("lorabind/video"),
                "fps": ("FLOAT", {"default": 24.0, "min": 1.0, "max": 240.0, "step": 0.01,
                                  "tooltip": "Frame rate; the video lasts frames / fps seconds."}),
                "format": (list(VIDEO_FORMATS), {"tooltip": "Container and codecs (video + sound)."}),
                "crf": ("INT", {"default": 19, "min": 0, "max": MAX_CRF, "step": 1,
                                "tooltip": "Constant quality: lower is better and larger (0 = lossless H.264)."}),
                "preset": (list(VIDEO_PRESETS), {"default": "medium",
                                                 "tooltip": "Encoder speed against size at the same quality "
                                                            "(x264 presets; VP9 maps them onto cpu-used)."}),
            },
            "optional": {
                "audio": (SOCKET_AUDIO, {"tooltip": "A soundtrack to mux in (batch items follow one another)."}),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def save(self, images, filename_prefix="lorabind/video", fps=24.0, format="mp4 (h264 + aac)", crf=19,
             preset="medium", audio=None, prompt=None, extra_pnginfo=None):
        video_format = VIDEO_FORMATS.get(format)
        if video_format is None or preset not in VIDEO_PRESETS:
            raise LoraBindError(f"LoraBindSaveVideo: unknown format {format!r} or preset {preset!r}; expected one "
                                f"of {list(VIDEO_FORMATS)} and {list(VIDEO_PRESETS)}")
        height, width = int(images.shape[1]), int(images.shape[2])
        full_folder, filename, counter, subfolder = output_target(filename_prefix, video_format.extension,
                                                                  width, height)
        file = f"{filename}_{counter:05}_.{video_format.extension}"
        metadata = {**({"prompt": prompt} if prompt is not None else {}), **(extra_pnginfo or {})}
        try:
            written = write_video(os.path.join(full_folder, file), images, fps, video_format, int(crf), preset,
                                  audio=audio, metadata=metadata)
        except ValueError as error:
            raise LoraBindError(f"LoraBindSaveVideo: {error}") from error
        except ImportError as error:  # PyAV is a dependency, but a ComfyUI install may have lost it
            raise LoraBindError(f"LoraBindSaveVideo needs PyAV to encode video ({error}); install it with "
                                f"pip install av") from error
        ui = {"images": [{"filename": file, "subfolder": subfolder, "type": "output"}], "animated": [True]}
        if written.padded:
            ui["text"] = [f"{width}x{height} padded to {written.width}x{written.height}: yuv420p needs an even "
                          f"width and height"]
        return {"ui": ui}


NODE_CLASS_MAPPINGS = {"LoraBindSaveVideo": LoraBindSaveVideo}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindSaveVideo": "Save Video MP4 / WebM (lorabind)"}
