"""Start/end images for the image-to-video examples, drawn offline into the input folder under ``lorabind-tiny/``.

Why generated, not committed: like the tiny models they are build products (``lorabind models build-tiny``, or
on first use when a prompt names them). They live in their own ``lorabind-tiny/`` folder so a user's input
folder never gets a file under a name they might use. The pictures are deterministic (same bytes every build,
an unchanged file is not rewritten) and have structure a VAE can tell apart: a gradient and a disc that moves
between the start and the end frame.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..loaders.io.atomic_files import write_atomically

INPUT_FOLDER = "lorabind-tiny"
START_IMAGE = f"{INPUT_FOLDER}/start.png"
END_IMAGE = f"{INPUT_FOLDER}/end.png"
INPUT_IMAGES = (START_IMAGE, END_IMAGE)
IMAGE_SIZE = (64, 64)  # width, height: a multiple of every tiny model's pixel grid (16, and 32 for TI2V)


def _picture(disc_centre: tuple) -> bytes:
    from PIL import Image, ImageDraw

    width, height = IMAGE_SIZE
    image = Image.new("RGB", IMAGE_SIZE)
    image.putdata([(4 * x, 4 * y, 255 - 2 * (x + y)) for y in range(height) for x in range(width)])
    x, y = disc_centre
    ImageDraw.Draw(image).ellipse((x - 12, y - 12, x + 12, y + 12), fill=(250, 210, 40), outline=(20, 20, 20))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_input_images(input_dir) -> list:
    """Write ``lorabind-tiny/start.png`` and ``end.png`` under ``input_dir``; return the paths."""
    written = []
    for name, centre in ((START_IMAGE, (20, 24)), (END_IMAGE, (44, 40))):
        path = Path(input_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _picture(centre)
        if not (path.is_file() and path.read_bytes() == data):
            write_atomically(str(path), lambda temp_path, data=data: Path(temp_path).write_bytes(data))
        written.append(path)
    return written


def ensure_input_images(named, input_dir) -> list:
    """Write the example images when a prompt names one (``named``: its string inputs) and it is missing.

    Returns the names that were missing and are now written.
    """
    missing = [name for name in INPUT_IMAGES if name in named and not (Path(input_dir) / name).is_file()]
    if missing:
        write_input_images(input_dir)
    return missing
