"""Start/end images for the image-to-video examples and a short control clip for the VACE example, drawn offline into the input folder under ``lorabind-tiny/``.

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
# an animated PNG (LoadImage gives its frames as one IMAGE batch): the disc moving from the start to the end place
CONTROL_VIDEO = f"{INPUT_FOLDER}/control.png"
CONTROL_FRAMES = 5
INPUT_IMAGES = (START_IMAGE, END_IMAGE, CONTROL_VIDEO)
_START_CENTRE, _END_CENTRE = (20, 24), (44, 40)
IMAGE_SIZE = (64, 64)  # width, height: a multiple of every tiny model's pixel grid (16, and 32 for TI2V)


def _frame(disc_centre: tuple):
    from PIL import Image, ImageDraw

    width, height = IMAGE_SIZE
    image = Image.new("RGB", IMAGE_SIZE)
    image.putdata([(4 * x, 4 * y, 255 - 2 * (x + y)) for y in range(height) for x in range(width)])
    x, y = disc_centre
    ImageDraw.Draw(image).ellipse((x - 12, y - 12, x + 12, y + 12), fill=(250, 210, 40), outline=(20, 20, 20))
    return image


def _picture(disc_centre: tuple) -> bytes:
    buffer = io.BytesIO()
    _frame(disc_centre).save(buffer, format="PNG")
    return buffer.getvalue()


def _control_clip() -> bytes:
    """``CONTROL_FRAMES`` frames of the disc travelling from the start image's place to the end image's."""
    steps = CONTROL_FRAMES - 1
    frames = [_frame(tuple(a + (b - a) * i // steps for a, b in zip(_START_CENTRE, _END_CENTRE)))
              for i in range(CONTROL_FRAMES)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="PNG", save_all=True, append_images=frames[1:], duration=62, loop=0)
    return buffer.getvalue()


def write_input_images(input_dir) -> list:
    """Write ``lorabind-tiny/start.png``, ``end.png`` and ``control.png`` under ``input_dir`` where they are
    missing or differ; return the paths written (a file already holding the same bytes is left alone)."""
    written = []
    for name, data in ((START_IMAGE, _picture(_START_CENTRE)), (END_IMAGE, _picture(_END_CENTRE)),
                       (CONTROL_VIDEO, _control_clip())):
        path = Path(input_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
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
