"""The frontend's settings: ``GET/POST /settings`` and ``/settings/{id}``, one JSON file in the user folder.

Why one parse function for reading and writing: a document accepted on write must be readable on the next read.
A setting nested 100 deep once passed the body's depth limit but made the stored file one level too deep for
the reader, which then answered ``{}``, and the next save wrote that ``{}`` back over every setting. Now the
document about to be written is checked by the very function that reads it (size, depth, an object), and a
stored file that cannot be read is an error (500 naming the file) for reads and writes alike, never ``{}``:
nothing overwrites settings we could not read.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from aiohttp import web

from ....loaders.io import json_limits
from ....loaders.io.atomic_files import write_atomically
from ..http_json import bad_request, parse_json, read_bounded_body, too_large
from .routes_userdata import user_root

MAX_SETTINGS_BYTES = 1024 * 1024  # the frontend's settings are a few hundred small values
SETTINGS_FILE = "comfy.settings.json"  # ComfyUI's name, inside the user's folder
_settings_lock = threading.Lock()


def register(routes: web.RouteTableDef) -> None:
    routes.get("/settings")(get_settings)
    routes.post("/settings")(post_settings)
    routes.get("/settings/{id}")(get_setting)
    routes.post("/settings/{id}")(post_setting)


class _Unreadable(ValueError):
    """Why a settings document is refused (too large, not JSON, too deep, not an object)."""


def parse_settings(raw: bytes) -> dict:
    """The one rule for a settings document, applied on read and before every write."""
    if len(raw) > MAX_SETTINGS_BYTES:
        raise _Unreadable(f"it has {len(raw)} bytes, over the limit of {MAX_SETTINGS_BYTES}")
    try:
        settings = json_limits.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Unreadable(f"it is not valid JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise _Unreadable(f"it holds a {type(settings).__name__}, not an object")
    return settings


def _stored_settings(path: Path) -> dict:
    """The stored settings; {} only when there is no file yet. 500 naming the file when it cannot be read."""
    try:
        size = path.stat().st_size
        if size > MAX_SETTINGS_BYTES:  # refused before reading it
            raise _unreadable_error(f"it has {size} bytes, over the limit of {MAX_SETTINGS_BYTES}")
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise _unreadable_error(f"it cannot be read ({exc.strerror})") from None
    try:
        return parse_settings(raw)
    except _Unreadable as exc:
        raise _unreadable_error(str(exc)) from None


def _unreadable_error(reason: str) -> web.HTTPException:
    return bad_request("settings_unreadable", f"The stored settings (userdata/{SETTINGS_FILE} in the server's "
                       f"state folder) cannot be used: {reason}. Fix or delete that file; until then settings are "
                       "neither read nor saved, so nothing in it is lost.", status=500)


def _update_settings(path: Path, changes: dict) -> None:
    with _settings_lock:  # two tabs saving at once must not lose each other's keys
        settings = _stored_settings(path)
        settings.update(changes)
        raw = json.dumps(settings, indent=4).encode("utf-8")
        if len(raw) > MAX_SETTINGS_BYTES:
            raise too_large(f"The settings would grow to {len(raw)} bytes, over the limit of {MAX_SETTINGS_BYTES}; "
                            "nothing was saved.")
        try:
            parse_settings(raw)
        except _Unreadable as exc:
            raise bad_request("invalid_setting", f"The settings would not be readable after this change ({exc}); "
                              "nothing was saved.") from None
        write_atomically(str(path), lambda temp: Path(temp).write_bytes(raw))


def _settings_path(request: web.Request) -> Path:
    return user_root(request) / SETTINGS_FILE


async def get_settings(request: web.Request) -> web.Response:
    return web.json_response(await asyncio.to_thread(_stored_settings, _settings_path(request)))


async def get_setting(request: web.Request) -> web.Response:
    settings = await asyncio.to_thread(_stored_settings, _settings_path(request))
    return web.json_response(settings.get(request.match_info["id"]))


async def _json_value(request: web.Request):
    return await parse_json(await read_bounded_body(request, MAX_SETTINGS_BYTES, json_limits.ValueCount()))


async def post_settings(request: web.Request) -> web.Response:
    """Merge ``{id: value, ...}`` into the stored settings."""
    changes = await _json_value(request)
    if not isinstance(changes, dict):
        raise bad_request("invalid_json", f"Request body must be a JSON object, got {type(changes).__name__}.")
    await asyncio.to_thread(_update_settings, _settings_path(request), changes)
    return web.Response(status=200)


async def post_setting(request: web.Request) -> web.Response:
    """Store one setting; the body is its JSON value."""
    value = await _json_value(request)
    await asyncio.to_thread(_update_settings, _settings_path(request), {request.match_info["id"]: value})
    return web.Response(status=200)
