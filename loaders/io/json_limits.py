"""JSON parsing with a bound on nesting, for every JSON text a user or a file hands us.

Why our own wrapper: ``json.loads`` of 100k nested ``[`` raises ``RecursionError`` (a ``RuntimeError``, not a
``ValueError``), which every caller's "not valid JSON" handler misses, so it surfaced as a 500 or a raw
traceback. And a document nested a few hundred levels deep parses, then breaks whatever walks it recursively
later (copying, validation, ``json.dumps``). No workflow, safetensors header, adapter config or history entry
comes near ``MAX_JSON_DEPTH``; deeper documents are refused with an error that *is* a ``JSONDecodeError``, so
the existing handlers word it like any other malformed JSON.

A JSON *file* is read through ``load_file``, the one place that opens it: regular files only, within a byte
budget (``regular_files``), so a FIFO, a link to ``/dev/zero`` or a padded multi-gigabyte "config" is refused at
once instead of hanging or filling memory.
"""

from __future__ import annotations

import json

from .regular_files import read_bounded

MAX_JSON_DEPTH = 100
# The most bytes a JSON file we read may hold: far above every config, index and tokenizer file of the shipped
# models (the largest, a weight index of a sharded 14B model, is about 100 KB), and small enough to parse in well
# under a second.
MAX_JSON_FILE_BYTES = 16 << 20
# An upper bound on the values of a JSON text a request may carry. A 1,000-node UI workflow sent together with its
# API prompt is about 100k values; parsing 22M small values took 9 s and walking them 30 s more.
MAX_JSON_VALUES = 500_000


class JSONTooDeepError(json.JSONDecodeError):
    """A JSON document nested deeper than we accept."""

    def __init__(self, limit: int):
        ValueError.__init__(self, f"JSON nested more than {limit} levels deep")
        self.msg, self.doc, self.pos, self.lineno, self.colno = str(self), "", 0, 1, 1

    def __reduce__(self):
        return JSONTooDeepError, (MAX_JSON_DEPTH,)


class ValueCount:
    """An upper bound on the number of values in a JSON text, counted as its bytes arrive, before any parsing.

    Every value after the first of a container follows a comma, and every container opens with a bracket, so
    values <= 1 + commas + brackets. Counting bytes is C-speed (``bytes.count``) and needs no state across chunk
    boundaries; commas and brackets inside strings make the bound looser, never wrong. Why count before
    parsing: ``json.loads`` holds the GIL for its whole run, so a huge document stalls every other thread (the
    server's event loop included) however it is scheduled; refusing it on the count costs microseconds per chunk.
    """

    def __init__(self, limit: int = MAX_JSON_VALUES):
        self.limit = limit
        self.count = 1

    def add(self, chunk: bytes) -> bool:
        """Count ``chunk``; False once the text holds more than ``limit`` values."""
        self.count += chunk.count(b",") + chunk.count(b"{") + chunk.count(b"[")
        return self.count <= self.limit


def loads(text, *, max_depth: int = MAX_JSON_DEPTH, **kwargs):
    """``json.loads`` that raises ``JSONTooDeepError`` instead of ``RecursionError`` or a too-deep value."""
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise JSONTooDeepError(max_depth) from None
    if _depth_exceeds(value, max_depth):
        raise JSONTooDeepError(max_depth)
    return value


def load(handle, **kwargs):
    """``loads`` of an open file's whole text: for a file the user names on the command line (a workflow, a
    ``--config``), which may be a pipe (``<(...)``); a model's own files go through ``load_file``."""
    return loads(handle.read(), **kwargs)


def load_file(path, *, max_bytes: int = MAX_JSON_FILE_BYTES, **kwargs):
    """The JSON value of the file at ``path``: a regular file of at most ``max_bytes`` bytes, UTF-8 text (else
    ``OSError`` from ``regular_files``, or ``JSONDecodeError``), parsed by ``loads``."""
    data = read_bounded(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", "", 0) from None
    return loads(text, **kwargs)


def _depth_exceeds(value, limit: int) -> bool:
    """Iterative walk (a recursive one would hit the very limit we are guarding against)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
