"""Reading a diffusers folder's ``model_index.json``, bounded and with errors naming the file.

Why a module of its own: the model store, the memory planner and the merge engine all read it, and the memory
planner is imported by the model store (lazily); keeping the reader here keeps that graph free of circles.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelLoadError
from . import json_limits


def is_set(entry) -> bool:
    """A model_index component entry is set unless it is ``[null, null]`` (diffusers' "absent"): the one test
    every reader of an index uses (a two-expert Wan2.2 folder is told from Wan2.1 by it)."""
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] is not None and entry[1] is not None


# a model_index.json is a few hundred bytes; a megabyte is no index
MAX_INDEX_BYTES = 1 << 20


def read_model_index(path) -> dict:
    """The folder's ``model_index.json`` as a dict (a regular file of at most ``MAX_INDEX_BYTES``: a FIFO or a
    link to ``/dev/zero`` is refused at once), else ``ModelLoadError`` naming the file."""
    index_file = Path(path) / "model_index.json"
    try:
        index = json_limits.load_file(index_file, max_bytes=MAX_INDEX_BYTES)
    except FileNotFoundError:
        raise ModelLoadError(f"{index_file}: not found (a diffusers model folder needs model_index.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{index_file}: cannot be read: {exc}") from exc
    if not isinstance(index, dict):
        raise ModelLoadError(f"{index_file}: not a JSON object")
    return index
