"""JSON parsing with a bound on nesting, for every JSON text a user or a file hands us.

Why our own wrapper: ``json.loads`` of 100k nested ``[`` raises ``RecursionError`` (a ``RuntimeError``, not a
``ValueError``), which every caller's "not valid JSON" handler misses, so it surfaced as a 500 or a raw
traceback. And a document nested a few hundred levels deep parses, then breaks whatever walks it recursively
later (copying, validation, ``json.dumps``). No workflow, safetensors header, adapter config or history entry
comes near ``MAX_JSON_DEPTH``; deeper documents are refused with an error that *is* a ``JSONDecodeError``, so
the existing handlers word it like any other malformed JSON.
"""

from __future__ import annotations

import json

MAX_JSON_DEPTH = 100


class JSONTooDeepError(json.JSONDecodeError):
    """A JSON document nested deeper than we accept."""

    def __init__(self, limit: int):
        ValueError.__init__(self, f"JSON nested more than {limit} levels deep")
        self.msg, self.doc, self.pos, self.lineno, self.colno = str(self), "", 0, 1, 1

    def __reduce__(self):
        return JSONTooDeepError, (MAX_JSON_DEPTH,)


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
    return loads(handle.read(), **kwargs)


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
