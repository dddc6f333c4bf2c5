"""Files that a replica's save nodes wrote, carried back into the front's output (or temp) folder.

Why carried, not shared: a replica may run on another machine, so its output folder is private to it. Each
``executed`` event takes the bytes of the files its UI payload names; the front writes them into its own folder
under a free ``<prefix>_<counter>_`` name (two replicas both count from 00001) and rewrites the payload, so
``/view`` and ``/history`` work as on one machine.

Why the replica keeps a file after carrying it: the same prompt again is answered from the replica's output
cache, whose ``executed`` event names the file the first run wrote. Carried again, its bytes land under a fresh
name in the front's folder; deleted, the answer would name whatever the front now holds under the old name
(another prompt's file). So a replica keeps exactly the files its output cache can still replay (``keep_only``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading

from ...loaders.io.atomic_files import write_atomically

FILE_TYPES = ("output", "temp")
MAX_FILE_BYTES = 2 * 1024 ** 3  # one output file carried through Ray's object store
_placing = threading.Lock()  # two worker threads must not pick the same free name
_COUNTER = re.compile(r"^(?P<stem>.*_)(?P<counter>\d{5,})(?P<rest>_.*)$")


def _file_entries(ui: dict):
    for value in (ui or {}).values():
        for entry in value if isinstance(value, list) else ():
            if isinstance(entry, dict) and entry.get("type") in FILE_TYPES and entry.get("filename"):
                yield entry


def _inside(folder: str, subfolder: str, filename: str) -> str:
    path = os.path.realpath(os.path.join(folder, subfolder or "", filename))
    if os.path.commonpath([path, os.path.realpath(folder)]) != os.path.realpath(folder):
        raise ValueError(f"output {subfolder}/{filename} leaves its folder")
    return path


_carried: set = set()  # real paths of the files carried to the front and still in this replica's folders
_carried_lock = threading.Lock()


def take_files(ui: dict, folders: dict) -> list[dict]:
    """On the replica: read every file named in a UI payload (kept for a replay: ``keep_only``); ``folders``
    maps type -> folder."""
    files = []
    for entry in _file_entries(ui):
        path = _inside(folders[entry["type"]], entry.get("subfolder", ""), entry["filename"])
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_FILE_BYTES:
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        with _carried_lock:
            _carried.add(os.path.realpath(path))
        files.append({"type": entry["type"], "subfolder": entry.get("subfolder", ""),
                      "filename": entry["filename"], "data": data})
    return files


def keep_only(uis: list, folders: dict) -> None:
    """On the replica, after a prompt: remove every file already carried to the front that none of ``uis`` (its
    output cache's) names, so the folders hold what a cached answer may carry again and nothing more. Only carried
    files: a replica of ``--max-batch`` above 1 runs other prompts meanwhile, whose files are still being written."""
    named = set()
    for ui in uis:
        for entry in _file_entries(ui):
            try:
                named.add(_inside(folders[entry["type"]], entry.get("subfolder", ""), entry["filename"]))
            except ValueError:  # a name that leaves its folder was never carried either
                continue
    with _carried_lock:
        gone = [path for path in _carried if path not in named]
        _carried.difference_update(gone)
    for path in gone:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _free_name(folder: str, filename: str) -> str:
    """``filename`` if free in ``folder``, else the same name with the next free ComfyUI counter."""
    if not os.path.exists(os.path.join(folder, filename)):
        return filename
    match = _COUNTER.match(filename)
    stem, rest = (match["stem"], match["rest"]) if match else (os.path.splitext(filename)[0] + "_", "_" +
                                                               os.path.splitext(filename)[1])
    counter = int(match["counter"]) if match else 1
    while True:
        counter += 1
        candidate = f"{stem}{counter:05}{rest}"
        if not os.path.exists(os.path.join(folder, candidate)):
            return candidate


def place_files(files: list[dict], folders: dict) -> dict:
    """On the front: write carried files under free names; returns {(type, subfolder, old name): new name}."""
    renamed = {}
    with _placing:
        for item in files:
            folder = os.path.dirname(_inside(folders[item["type"]], item["subfolder"], "x"))
            os.makedirs(folder, exist_ok=True)
            name = _free_name(folder, item["filename"])
            data = item["data"]

            def write(temp_path: str, data=data) -> None:
                with open(temp_path, "wb") as handle:
                    handle.write(data)

            write_atomically(os.path.join(folder, name), write)
            renamed[(item["type"], item["subfolder"], item["filename"])] = name
    return renamed


def rename_in_ui(ui: dict, renamed: dict) -> dict:
    """A copy of a UI payload with carried files under their new names."""
    if not renamed:
        return ui
    copy = {key: [dict(entry) if isinstance(entry, dict) else entry for entry in value]
            if isinstance(value, list) else value for key, value in ui.items()}
    for entry in _file_entries(copy):
        key = (entry["type"], entry.get("subfolder", ""), entry["filename"])
        entry["filename"] = renamed.get(key, entry["filename"])
    return copy
