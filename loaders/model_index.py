"""Reading a diffusers folder's ``model_index.json``, bounded and with errors naming the file.

Why a module of its own: the model store, the memory planner and the merge engine all read it, and the memory
planner is imported by the model store (lazily); keeping the reader here keeps that graph free of circles.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import json_limits
from .errors import ModelLoadError


def read_model_index(path) -> dict:
    index_file = Path(path) / "model_index.json"
    try:
        return json_limits.loads(index_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{index_file}: not found (a diffusers model folder needs model_index.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{index_file}: cannot be read: {exc}") from exc
