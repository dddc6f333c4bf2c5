"""Shared by the image-to-video tests: the three tiny I2V models, their fixture LoRAs and the example images,
built once per test process (offline, deterministic) into a temporary folder removed at exit."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

I2V_MODELS = ("tiny-wan22-i2v", "tiny-wan21-i2v", "tiny-wan22-ti2v")


@functools.lru_cache(maxsize=None)
def i2v_root() -> Path:
    """A models root (``diffusers/``, ``loras/``) with an ``input/`` folder holding ``lorabind-tiny/*.png``."""
    from lorabind.loaders.tiny_models import build_tiny
    from lorabind.loaders.tiny_models.input_images import write_input_images
    from lorabind.loaders.tiny_models.lora_fixtures import write_fixture_loras

    root = Path(tempfile.mkdtemp(prefix="lorabind-i2v-"))
    atexit.register(shutil.rmtree, root, True)
    build_tiny(root, names=I2V_MODELS + ("tiny-wan22-t2v",))
    write_fixture_loras(root)
    write_input_images(root / "input")
    return root


def load_i2v(name: str):
    from lorabind.loaders.model_store import load_model

    return load_model(i2v_root() / "diffusers" / name, name=name)


def example_image(which: str = "start"):
    """The example start/end frame as ComfyUI IMAGE (what LoadImage gives)."""
    from lorabind.loaders.image_files import load_image_file

    return load_image_file(i2v_root() / "input" / "lorabind-tiny" / f"{which}.png")[0]
