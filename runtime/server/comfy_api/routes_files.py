"""``GET /view`` and ``POST /upload/image``, confined to the output/input/temp folders.

Confinement is checked on real paths (symlinks resolved), so neither ``..``, an absolute name, a subfolder
escaping the root nor a symlink pointing outside can reach other files. Names are refused rather than
"cleaned": a client sending ``../x`` has a bug or bad intent, and silently writing elsewhere hides both.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import urllib.parse
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ....loaders.io.atomic_files import write_atomically
from ..composition_root import STATE_KEY, ServerState
from ..http_json import bad_request
from ..media_types import media_type

# Served as downloads, never rendered: a file in output/ must not become script running on our origin.
DANGEROUS_MIMETYPES = {"text/html", "text/javascript", "application/javascript", "application/xhtml+xml",
                       "image/svg+xml", "text/xml", "application/xml", "text/css"}
_ANNOTATION = re.compile(r"^(?P<name>.*?)\s*\[(?P<kind>output|input|temp)\]$")
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME_BYTES = 255  # the longest file name (one path component) common file systems store
# Largest image /view decodes for a preview or channel conversion (8192 x 8192). The header is read first, so a
# small file declaring a huge canvas (a 164 KB PNG of 13000 x 13000) is refused before any pixel is decoded.
MAX_PREVIEW_PIXELS = 8192 * 8192


class _TooLarge(Exception):
    pass


def register(routes: web.RouteTableDef) -> None:
    routes.get("/view")(get_view)
    routes.post("/upload/image")(post_upload_image)


def _check_name(name: str, field: str) -> None:
    """A bare file name: no separators, no '..', not absolute, not empty, no control characters (CR/LF would
    also end up in headers), at most 255 bytes (400 otherwise)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or ".." in name \
            or _CONTROL_CHARACTERS.search(name) or os.path.isabs(name):
        raise bad_request("invalid_path", f"Field '{field}' must be a plain file name, got {name[:300]!r}.")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise bad_request("invalid_path", f"Field '{field}' is longer than {MAX_NAME_BYTES} bytes.")


def content_disposition(filename: str) -> str:
    """RFC 6266: an ASCII fallback ``filename`` plus the exact name as RFC 5987 ``filename*`` (quotes, non-ASCII
    and control characters in a name can neither break the header nor be misread)."""
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%' else "_" for c in filename)
    return f"filename=\"{fallback}\"; filename*=UTF-8''{urllib.parse.quote(filename, safe='')}"


def confined_dir(root: str, subfolder: str, field: str = "subfolder") -> Path:
    """``root/subfolder`` as a real path inside ``root`` — 403 if it escapes (ComfyUI's status for this)."""
    if _CONTROL_CHARACTERS.search(subfolder) or os.path.isabs(subfolder) \
            or any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in re.split(r"[/\\]", subfolder)):
        raise bad_request("invalid_path", f"Field '{field}' must be a relative folder, got {subfolder!r}.", status=403)
    real_root = Path(root).resolve()
    target = (real_root / subfolder).resolve()
    if target != real_root and real_root not in target.parents:
        raise bad_request("invalid_path", f"Field '{field}' {subfolder!r} leaves the {Path(root).name!r} folder.",
                          status=403)
    return target


def _directory(state: ServerState, kind: str, field: str = "type") -> str:
    directory = state.config.directory_for(kind)
    if directory is None:
        raise bad_request("invalid_type", f"Field '{field}' must be one of output, input, temp; got {kind!r}.")
    return directory


async def get_view(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE_KEY]
    filename = request.query.get("filename", "")
    kind = request.query.get("type", "output")
    match = _ANNOTATION.match(filename)
    if match:  # ComfyUI allows "name.png [input]" to pick the folder
        filename, kind = match.group("name"), match.group("kind")
    _check_name(filename, "filename")
    folder = confined_dir(_directory(state, kind), request.query.get("subfolder", ""))
    path = (folder / filename).resolve()
    if path.parent != folder or not path.is_file():
        raise web.HTTPNotFound(text=f"{kind}/{request.query.get('subfolder', '')}/{filename} not found")

    preview, channel = request.query.get("preview"), request.query.get("channel", "rgba")
    if preview or channel != "rgba":
        return await _converted_image(path, preview, channel)
    content_type = media_type(path.name)
    if content_type in DANGEROUS_MIMETYPES:
        content_type = "application/octet-stream"
    return web.FileResponse(path, headers={"Content-Type": content_type,
                                           "Content-Disposition": content_disposition(path.name)})


async def _converted_image(path: Path, preview: str | None, channel: str) -> web.Response:
    """``channel=rgb|a`` and ``preview=webp;90|jpeg;90`` as ComfyUI's frontend requests them."""
    if channel not in ("rgba", "rgb", "a"):
        raise bad_request("invalid_request", f"Query parameter 'channel' must be rgba, rgb or a; got {channel!r}.")
    fmt, quality = "png", 90
    if preview:
        fmt, _, q = preview.partition(";")
        fmt = fmt.lower()
        if fmt not in ("webp", "jpeg", "png"):
            raise bad_request("invalid_request", f"Query parameter 'preview' format must be webp, jpeg or png; "
                              f"got {fmt!r}.")
        quality = int(q) if q.isdigit() else 90

    from PIL import Image

    def convert() -> bytes:
        with Image.open(path) as img:
            if img.width * img.height > MAX_PREVIEW_PIXELS:
                raise _TooLarge(f"{path.name} is {img.width}x{img.height} pixels; previews are made of images up "
                                f"to {MAX_PREVIEW_PIXELS} pixels (request it without 'preview'/'channel')")
            img = img.convert("RGBA")
            if channel == "rgb":
                img = img.convert("RGB")
            elif channel == "a":
                img = img.getchannel("A")
            if fmt == "jpeg" and img.mode == "RGBA":
                img = img.convert("RGB")
            buffer = io.BytesIO()
            img.save(buffer, format=fmt.upper(), quality=quality)
            return buffer.getvalue()

    try:
        data = await asyncio.to_thread(convert)
    except _TooLarge as exc:
        raise bad_request("image_too_large", str(exc)) from None
    except (OSError, Image.DecompressionBombError) as exc:
        raise bad_request("invalid_image", f"{path.name} is not an image that can be converted: {exc}") from None
    return web.Response(body=data, content_type=f"image/{fmt}",
                        headers={"Content-Disposition": content_disposition(f"{path.stem}.{fmt}")})


async def post_upload_image(request: web.Request) -> web.Response:
    """Multipart ``image`` (+ ``type``, ``subfolder``, ``overwrite``) → ``{name, subfolder, type}``.

    Same name and same bytes reuses the file; same name with other bytes becomes ``name (1).ext`` unless
    ``overwrite`` is true (ComfyUI's rules). The body limit (413) applies while reading.
    """
    state: ServerState = request.app[STATE_KEY]
    try:
        form = await request.post()
    except (ValueError, HttpProcessingError) as exc:  # HttpProcessingError: a part header broken by CR/LF
        raise bad_request("invalid_request", f"Expected a multipart/form-data body: {exc}") from None
    image = form.get("image")
    if image is None or not hasattr(image, "file"):
        raise bad_request("invalid_request", "Multipart field 'image' (a file) is missing.")
    _check_name(image.filename or "", "image filename")
    kind = str(form.get("type") or "input")
    subfolder = str(form.get("subfolder") or "")
    folder = confined_dir(_directory(state, kind), subfolder)
    overwrite = str(form.get("overwrite", "")).lower() in ("true", "1")
    data = image.file.read()
    name = await asyncio.to_thread(_store_upload, folder, image.filename, data, overwrite)
    return web.json_response({"name": name, "subfolder": subfolder, "type": kind})


def _store_upload(folder: Path, filename: str, data: bytes, overwrite: bool) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    stem, ext = os.path.splitext(filename)
    name, counter = filename, 1
    while not overwrite and (folder / name).exists():
        if _same_content(folder / name, data):
            return name
        name = f"{stem} ({counter}){ext}"
        counter += 1
    write_atomically(str(folder / name), lambda temp: Path(temp).write_bytes(data))
    return name


def _same_content(path: Path, data: bytes) -> bool:
    return path.is_file() and path.read_bytes() == data
