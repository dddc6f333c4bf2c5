"""The one rule for ids a client chooses (``prompt_id``, ``client_id``, the WebSocket's ``clientId``).

Why a rule at all: these ids are echoed into the server log, history file names' hashes, WebSocket routing and
every client's ``/queue`` view. A newline in one forged log lines; a reused one overwrote another client's
history entry. UUIDs (with or without dashes, as ComfyUI's clients make them) and short readable names pass;
control characters, spaces, quotes, slashes and anything longer than 128 characters do not.
"""

from __future__ import annotations

import re

_WELL_FORMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
RULE = "1 to 128 letters, digits, '-' or '_' (a UUID fits), starting with a letter or digit"


def is_well_formed(value) -> bool:
    return isinstance(value, str) and _WELL_FORMED.fullmatch(value) is not None
