"""Contract lookups for the editor route, run in a small worker pool with a timeout and cached by file identity.

Why: the web extension asks ``/lorabind/contract`` by itself for every LoRA a workflow names, so a lookup must
never cost the server much, however often it comes and whatever the file holds. Each answer, refusals included,
is cached under the identity of the files it was read from (device, inode, size, mtime of the file, or of a
folder's entries): asking again costs a few ``stat`` calls until a file changes. Concurrent lookups of one file
share one read; at most ``WORKERS`` files are read at once; a lookup that takes longer than ``TIMEOUT_S`` answers
503 while the read finishes in the background and caches its answer. The cache holds ``MAX_ENTRIES`` small JSON
answers, oldest dropped first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import OrderedDict
from typing import Callable

from ..usecases.verbs import file_identity
from ..usecases.vocabulary import LoraBindError

WORKERS = 2
TIMEOUT_S = 30.0
MAX_ENTRIES = 512
MAX_REASON_CHARS = 2000

Answer = tuple  # (HTTP status, JSON body)


def refusal(name: str, reason: str, status: int) -> Answer:
    """The endpoint's answer when no contract can be given: the report's shape with the reason."""
    return status, {"file": name, "family": None, "contract": None, "contracts": [], "reason": reason}


def _declared(name: str, path: str, declaration: Callable[[str, str], dict]) -> Answer:
    try:
        return 200, declaration(path, name)
    except LoraBindError as exc:  # a refused file (pickle, broken header, a contract it declares wrongly)
        return refusal(name, str(exc).replace(path, name)[:MAX_REASON_CHARS], 422)
    except OSError as exc:
        return refusal(name, f"{name!r} cannot be read ({exc.strerror})", 422)


class ContractLookups:
    """The cache and pool behind ``get_declared_contract`` (one per process: ``LOOKUPS``)."""

    def __init__(self):
        self._answers: OrderedDict[tuple, Answer] = OrderedDict()
        self._running: dict[tuple, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="lorabind-contract")
        self.reads = 0  # lookups that read files (the rest were answered from the cache or joined a read)

    async def answer(self, kind: str, name: str, path: str, declaration: Callable[[str, str], dict]) -> Answer:
        """The cached answer for these files, or one read in the pool (shared with concurrent askers)."""
        try:
            key = (kind, name, path, await asyncio.to_thread(file_identity, path))
        except OSError as exc:
            return refusal(name, f"{name!r} cannot be read ({exc.strerror})", 404)
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
            future = self._running.get(key)
            if future is None:
                future = self._pool.submit(self._read, key, name, path, declaration)
                self._running[key] = future
                self.reads += 1
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), TIMEOUT_S)
        except asyncio.TimeoutError:
            return refusal(name, f"reading {name!r} takes longer than {TIMEOUT_S:g} s; ask again later", 503)

    def _read(self, key: tuple, name: str, path: str, declaration) -> Answer:
        answer = None
        try:
            answer = _declared(name, path, declaration)
        finally:  # stored and released in one step; an unexpected error is not cached (the next ask reads again)
            with self._lock:
                self._running.pop(key, None)
                if answer is not None:
                    self._answers[key] = answer
                    while len(self._answers) > MAX_ENTRIES:
                        self._answers.popitem(last=False)
        return answer


LOOKUPS = ContractLookups()
