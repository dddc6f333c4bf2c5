"""The content type a served output file gets, from its suffix: one table for ``/view`` and the ``/v1`` results.

Why a table before ``mimetypes``: ``mimetypes`` reads the host's own maps (``/etc/mime.types``, the Windows
registry), which may lack ``.webm`` or map ``.mp4`` oddly; a browser plays a video only with its real type.
"""

from __future__ import annotations

import mimetypes
import os

MEDIA_TYPES = {".png": "image/png", ".webp": "image/webp", ".gif": "image/gif", ".mp4": "video/mp4",
               ".webm": "video/webm", ".wav": "audio/wav"}


def media_type(name: str) -> str:
    return MEDIA_TYPES.get(os.path.splitext(name)[1].lower()) or mimetypes.guess_type(name)[0] or \
        "application/octet-stream"
