"""Prompt history in ComfyUI's shape, persisted so a restarted server still answers ``GET /history``.

One JSON file per entry (``<seq>-<hash of prompt id>.json`` in the history folder) rather than one big file:
entries carry the whole UI workflow in ``extra_data``, so rewriting every entry after every prompt would grow
without bound. Each file is written atomically (``loaders.io.atomic_files.write_atomically``), so a crash
leaves either the old or the new entry, never half of one; an unreadable file is moved aside as ``.corrupt``
(and logged) instead of stopping the server. ``seq`` keeps ComfyUI's insertion order across restarts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable

from ...loaders.io import json_limits
from ...loaders.io.atomic_files import write_atomically
from ..executor.execution import node_meta

log = logging.getLogger("lorabind.server")

MAXIMUM_HISTORY_SIZE = 10000  # ComfyUI's limit; the oldest entries are dropped first
# Entries are kept in memory too, each with its prompt and extra_data (the UI workflow): bounded in bytes of JSON
# as well as in number, or 10 prompts of 20 MB each held 256 MB. The newest entry is always kept.
MAXIMUM_HISTORY_BYTES = 128 * 1024 * 1024
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")


class HistoryStore:
    def __init__(self, folder: str | os.PathLike, max_size: int = MAXIMUM_HISTORY_SIZE,
                 max_bytes: int = MAXIMUM_HISTORY_BYTES):
        self.folder = Path(folder)
        self.max_size = max_size
        self.max_bytes = max_bytes
        self._sizes: dict[str, int] = {}  # prompt id -> bytes of its entry's JSON
        self._bytes = 0  # their sum
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self._files: dict[str, Path] = {}
        self._seq = 0
        # called with (prompt_id, entry) after each entry is stored: how a request waiting for its prompt (the
        # OpenAI-style endpoints) learns that it finished without polling
        self.listeners: list[Callable[[str, dict], None]] = []
        self._load()

    def _load(self) -> None:
        """Read every entry file; any file that is not a well-formed entry is moved aside and logged.

        The folder is ours (``ServerConfig.state_dir``, out of reach of uploads and ``/view``), but a file in it
        can still be damaged or edited by hand, and no content may stop the server from starting: JSON parsing
        is depth-bounded, and ``seq`` must be a real integer (``1e400`` parses as infinity)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        records = []
        for path in self.folder.glob("*.json"):
            try:
                text = path.read_text(encoding="utf-8")
                records.append((*_parse_record(text), path, len(text)))
            except (OSError, ValueError) as exc:
                _move_aside(path, exc)
        for seq, prompt_id, entry, path, size in sorted(records, key=lambda r: r[0]):
            self._keep_locked(prompt_id, entry, path, size)
            self._seq = seq + 1
        self._trim_locked()

    def _write_locked(self, prompt_id: str, entry: dict) -> tuple[Path, int]:
        name = f"{self._seq:012d}-{hashlib.sha1(prompt_id.encode()).hexdigest()[:16]}.json"
        record = {"seq": self._seq, "prompt_id": prompt_id, "entry": entry}
        self._seq += 1
        path = self.folder / name
        text = json.dumps(record, default=str)
        write_atomically(str(path), lambda temp: Path(temp).write_text(text, encoding="utf-8"))
        return path, len(text)

    def _keep_locked(self, prompt_id: str, entry: dict, path: Path, size: int) -> None:
        self._entries[prompt_id] = entry
        self._files[prompt_id] = path
        self._bytes += size - self._sizes.get(prompt_id, 0)
        self._sizes[prompt_id] = size

    def _trim_locked(self) -> None:
        """Drop the oldest entries past the count or the byte budget (never the newest one)."""
        while len(self._entries) > self.max_size or (
                len(self._entries) > 1 and self._bytes > self.max_bytes):
            self._remove_locked(next(iter(self._entries)))

    def _remove_locked(self, prompt_id: str) -> None:
        self._entries.pop(prompt_id, None)
        self._bytes -= self._sizes.pop(prompt_id, 0)
        path = self._files.pop(prompt_id, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def add(self, prompt_id: str, entry: dict) -> None:
        with self._lock:
            self._remove_locked(prompt_id)
            self._keep_locked(prompt_id, entry, *self._write_locked(prompt_id, entry))
            self._trim_locked()
        for listener in list(self.listeners):
            listener(prompt_id, entry)

    def contains(self, prompt_id: str) -> bool:
        with self._lock:
            return prompt_id in self._entries

    def get(self, prompt_id: str) -> dict:
        """``{prompt_id: entry}`` or ``{}`` — ComfyUI's answer for ``GET /history/{id}``."""
        with self._lock:
            entry = self._entries.get(prompt_id)
            return {prompt_id: entry} if entry is not None else {}

    def list(self, max_items: int | None = None, offset: int = -1) -> dict:
        """Entries in insertion order; ComfyUI's default offset -1 means "the last max_items"."""
        with self._lock:
            items = list(self._entries.items())
        if offset < 0 and max_items is not None:
            offset = max(len(items) - max_items, 0)
        offset = max(offset, 0)
        end = offset + max_items if max_items is not None else None
        return dict(items[offset:end])

    def clear(self) -> None:
        with self._lock:
            for prompt_id in list(self._entries):
                self._remove_locked(prompt_id)

    def delete(self, prompt_ids) -> None:
        with self._lock:
            for prompt_id in prompt_ids:
                self._remove_locked(str(prompt_id))


def _parse_record(text: str) -> tuple[int, str, dict]:
    record = json_limits.loads(text)
    if not isinstance(record, dict):
        raise ValueError(f"expected an object, got {type(record).__name__}")
    seq, prompt_id, entry = record.get("seq"), record.get("prompt_id"), record.get("entry")
    if type(seq) is not int or not 0 <= seq < 10**15:
        raise ValueError(f"'seq' must be a non-negative integer, got {str(seq)[:40]!r}")
    if not isinstance(prompt_id, str) or not isinstance(entry, dict):
        raise ValueError("'prompt_id' must be a string and 'entry' an object")
    return seq, prompt_id, entry


def _move_aside(path: Path, reason: Exception) -> None:
    aside = path.with_suffix(".corrupt")
    try:
        os.replace(path, aside)
    except OSError as exc:
        log.warning("history entry %s is unreadable (%s) and cannot be moved aside (%s); skipped", path, reason, exc)
        return
    log.warning("history entry %s is unreadable (%s); moved to %s", path, reason, aside)


def history_entry(item, outputs: dict, status_str: str, completed: bool, messages: list, meta: dict) -> dict:
    """Build ComfyUI's history entry for a finished queue item (sensitive extra_data keys already removed).

    ``meta`` comes from the executor; nodes it does not describe get ComfyUI's plain entry."""
    return {
        "prompt": item.as_list(),
        "outputs": outputs,
        "status": {"status_str": status_str, "completed": completed, "messages": messages},
        "meta": {node_id: meta.get(node_id) or node_meta(node_id) for node_id in outputs},
    }
