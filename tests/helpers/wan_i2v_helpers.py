"""Shared by the image-to-video and VACE tests: the example start/end frames and control clip as ComfyUI IMAGEs,
drawn once per test process (``tiny_models.input_images``) into a temporary folder removed at exit. The tiny I2V models and their
fixture LoRAs come from the root conftest's ``tiny_models_root`` / ``load_tiny``."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

I2V_MODELS = ("tiny-wan22-i2v", "tiny-wan21-i2v", "tiny-wan22-ti2v")


@functools.lru_cache(maxsize=None)
def example_input_dir() -> Path:
    """An input folder holding ``lorabind-tiny/start.png`` and ``end.png``."""
    from lorabind.tiny_models.input_images import write_input_images

    folder = Path(tempfile.mkdtemp(prefix="lorabind-i2v-input-"))
    atexit.register(shutil.rmtree, folder, True)
    write_input_images(folder)
    return folder


def example_image(which: str = "start"):
    """The example start/end frame as ComfyUI IMAGE (what LoadImage gives)."""
    from lorabind.loaders.io.image_files import load_image_file

    return load_image_file(example_input_dir() / "lorabind-tiny" / f"{which}.png")[0]


def example_control_clip():
    """The example VACE control clip (an animated PNG, 5 frames of 64x64) as a ComfyUI IMAGE batch."""
    from lorabind.loaders.io.image_files import load_image_file

    return load_image_file(example_input_dir() / "lorabind-tiny" / "control.png")[0]


def pipeline_on_sigmas(pipeline_class, folder, sigmas):
    """A diffusers pipeline loaded from ``folder`` that steps FlowMatchEuler at shift 1 on exactly ``sigmas`` (its
    last, 0, implied): the Wan pipelines have no ``sigmas`` argument, so their scheduler's set_timesteps is given
    them (diffusers-feasibility.md §2)."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = pipeline_class.from_pretrained(folder, local_files_only=True)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)
    original = type(pipe.scheduler).set_timesteps

    def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
        return original(self, sigmas=np.asarray(sigmas[:-1], dtype=np.float64), device=device)

    pipe.scheduler.set_timesteps = set_timesteps.__get__(pipe.scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe
