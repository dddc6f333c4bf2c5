"""Write a file so that a reader never sees half of it: temp file in the same folder, then ``os.replace``.

Used for every output the pack writes (images, WAVs, extracted LoRAs). ``mkstemp`` creates the temp file with
mode 0600; the result gets the mode a plain ``open`` would give (0666 minus the umask) so outputs stay
shareable.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable


def _current_umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# Read once at import: os.umask can only be read by setting it, which is process-wide, so doing it per write
# could race with another thread creating a file.
FILE_MODE = 0o666 & ~_current_umask()


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(temp_path)`` to produce the file, then move it to ``path``; on any error remove the temp."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp_path = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".part", dir=folder)
    os.close(fd)
    try:
        write(temp_path)
        os.chmod(temp_path, FILE_MODE)
        os.replace(temp_path, path)
    except BaseException:
        if os.path.exists(temp_path):
            os.unlink(temp_path)
        raise
