"""The frontend's per-user storage: ``/settings``, ``/users`` and ``/userdata`` (saved workflows, user.css, ...).

The shapes are ComfyUI's (``app/user_manager.py``, ``app/app_settings.py``) so the official frontend saves,
lists, opens, renames and deletes workflows here as it does in ComfyUI. lorabind serves one user (ComfyUI's
single-user mode), whose files live in ``<state folder>/userdata/``: beside the history, out of reach of
uploads and ``/view``, and surviving a restart.

Every path a request names is confined to that folder: relative, no ``..``, no control characters, and the
real path (symlinks resolved) must stay inside; anything else is refused with 400/403 rather than cleaned up,
as in ``routes_files``. Bodies are bounded (``MAX_USERDATA_BYTES``) whatever ``--max-upload-size`` says; the
folder's file count and size have quotas (``user_files``), and a listing longer than a quota allows is refused
rather than cut short without a word. Settings are in ``routes_settings``.
"""

from __future__ import annotations

import asyncio
import mimetypes
import os
import re
from pathlib import Path

from aiohttp import web

from ..composition_root import STATE_KEY
from ..http_json import bad_request, read_bounded_body, too_large
from . import user_files

MAX_USERDATA_BYTES = 32 * 1024 * 1024  # a saved workflow with many nodes is a few MB; user.css far less
MAX_PATH_BYTES = 1024
MAX_NAME_PART_BYTES = 255  # what common file systems allow for one name
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def register(routes: web.RouteTableDef) -> None:
    routes.get("/users")(get_users)
    routes.post("/users")(post_users)
    routes.get("/userdata")(list_userdata)
    routes.get("/userdata/{file}")(get_userdata)
    routes.post("/userdata/{file}")(post_userdata)
    routes.delete("/userdata/{file}")(delete_userdata)
    routes.post("/userdata/{file}/move/{dest}")(move_userdata)


def user_root(request: web.Request) -> Path:
    """``<state folder>/userdata`` as a real path, created with its ``workflows/`` on first use (the frontend
    lists that folder at start; ComfyUI answers 404 for a new user, which the browser logs as an error)."""
    root = Path(request.app[STATE_KEY].config.state_dir, "userdata").resolve()
    (root / "workflows").mkdir(parents=True, exist_ok=True)
    return root


def confined_path(root: Path, relative: str, field: str = "file") -> Path:
    """``root/relative`` if it is a plain relative path that stays inside ``root`` after resolving symlinks.

    400 for names that are malformed on their face (absolute, ``..``, backslashes, control characters, empty
    parts, too long); 403 when a symlink on the way leads outside (ComfyUI's status for a path it refuses)."""
    parts = relative.split("/")
    if not relative or relative.startswith("/") or "\\" in relative or _CONTROL_CHARACTERS.search(relative) \
            or any(part in ("", ".", "..") for part in parts) or re.match(r"^[A-Za-z]:", relative) \
            or len(relative.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise bad_request("invalid_path", f"'{field}' must be a relative path inside the user folder without "
                          f"'..', got {relative[:300]!r}.")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_PART_BYTES for part in parts):
        raise bad_request("invalid_path", f"'{field}' has a name longer than {MAX_NAME_PART_BYTES} bytes, which "
                          f"file systems refuse: {relative[:300]!r}.")
    target = (root / relative).resolve()
    if root not in target.parents:
        raise bad_request("invalid_path", f"'{field}' {relative!r} leads outside the user folder.", status=403)
    return target


def _file_info(path: Path, root: Path) -> dict:
    stat = path.stat()
    return {"path": path.relative_to(root).as_posix(), "size": stat.st_size,
            "modified": int(stat.st_mtime * 1000), "created": int(stat.st_ctime * 1000)}


def _flag(request: web.Request, name: str, default: bool) -> bool:
    """ComfyUI's query booleans: ``overwrite`` is true unless "false"; the others only when "true"."""
    raw = request.query.get(name)
    if raw is None:
        return default
    return raw.lower() != "false" if default else raw.lower() == "true"


# -- users (single-user mode) ---------------------------------------------------------------------------------

async def get_users(request: web.Request) -> web.Response:
    """ComfyUI's single-user answer: settings and workflows are stored on the server, no login screen."""
    return web.json_response({"storage": "server", "migrated": True})


async def post_users(request: web.Request) -> web.Response:
    return web.json_response({"error": "lorabind serve has a single user; creating users is not supported."},
                             status=400)


# -- user data files --------------------------------------------------------------------------------------------

async def list_userdata(request: web.Request) -> web.Response:
    """``?dir=workflows&recurse=true&full_info=true&split=false``: the files under ``dir`` (404 if it does not
    exist yet, which the frontend reads as "no saved workflows")."""
    directory = request.query.get("dir", "")
    if not directory:
        raise bad_request("invalid_path", "Query parameter 'dir' is required.")
    root = user_root(request)
    folder = confined_path(root, directory.rstrip("/"), "dir")
    if not folder.is_dir():
        raise web.HTTPNotFound(text=f"no user folder {directory!r}")
    recurse, full_info, split = (_flag(request, name, False) for name in ("recurse", "full_info", "split"))

    def listing() -> list:
        files = []
        walker = os.walk(folder) if recurse else [(str(folder), [], os.listdir(folder))]
        for current, _, names in walker:
            for name in sorted(names):
                path = Path(current, name)
                # a symlink leading out of the user folder is neither listed nor followed
                if not path.is_file() or root not in path.resolve().parents:
                    continue
                relative = path.relative_to(folder).as_posix()
                if full_info:
                    info = _file_info(path, folder)
                    files.append(info)
                else:
                    files.append([relative, *relative.split("/")] if split else relative)
                if len(files) > user_files.MAX_USER_FILES:
                    raise too_large(f"{directory!r} holds more than {user_files.MAX_USER_FILES} files, the most a "
                                    "listing returns; delete some, or list one of its subfolders.")
        return files

    return web.json_response(await asyncio.to_thread(listing))


async def get_userdata(request: web.Request) -> web.StreamResponse:
    path = confined_path(user_root(request), request.match_info["file"])
    if not path.is_file():
        raise web.HTTPNotFound(text=f"no user file {request.match_info['file']!r}")
    # Never rendered inline (a stored page must not run script on our origin), except user.css, which the
    # frontend's index.html links as a stylesheet. JSON stays JSON for the frontend's fetch().
    content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if path == user_root(request) / "user.css":
        content_type, disposition = "text/css", "inline"
    else:
        disposition = "attachment"
        if content_type != "application/json":
            content_type = "application/octet-stream"
    return web.FileResponse(path, headers={"Content-Type": content_type, "X-Content-Type-Options": "nosniff",
                                           "Content-Disposition": disposition})


async def post_userdata(request: web.Request) -> web.Response:
    """Write the raw body to the file (atomically); 409 when it exists and ``overwrite=false``, checked when the
    body has arrived, together with the write (``user_files``)."""
    root = user_root(request)
    shown = request.match_info["file"]
    path = confined_path(root, shown)
    body = await read_bounded_body(request, MAX_USERDATA_BYTES)
    written = await _stored(user_files.write_user_file, root, path, body, _flag(request, "overwrite", True), shown)
    if not written:
        return web.Response(status=409, text="File already exists")
    return web.json_response(_file_info(path, root) if _flag(request, "full_info", False)
                             else path.relative_to(root).as_posix())


async def _stored(operation, *args) -> bool:
    """Run a ``user_files`` operation in a thread; its refusals become JSON errors with their status."""
    try:
        return await asyncio.to_thread(operation, *args)
    except user_files.UserFileRefused as exc:
        if exc.status == 413:
            raise too_large(str(exc)) from None
        raise bad_request("invalid_path", str(exc), status=exc.status) from None


async def delete_userdata(request: web.Request) -> web.Response:
    path = confined_path(user_root(request), request.match_info["file"])
    if not path.is_file():
        raise web.HTTPNotFound(text=f"no user file {request.match_info['file']!r}")
    path.unlink()
    return web.Response(status=204)


async def move_userdata(request: web.Request) -> web.Response:
    """Rename within the user folder (the frontend's "rename workflow"); 409 when the destination exists and
    ``overwrite=false``."""
    root = user_root(request)
    source = confined_path(root, request.match_info["file"])
    dest = confined_path(root, request.match_info["dest"], "dest")
    moved = await _stored(user_files.move_user_file, root, source, dest, _flag(request, "overwrite", True),
                          request.match_info["dest"])
    if not moved:
        return web.Response(status=409, text="File already exists")
    return web.json_response(_file_info(dest, root) if _flag(request, "full_info", False)
                             else dest.relative_to(root).as_posix())
